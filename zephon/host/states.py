"""A rank or global checkpoint as a fixed-size byte buffer, for hosts that store tensors (TorchTitan's DCP).

The JSON is canonical (sorted keys, no spaces) and zero-padded to a capacity that is a pure function of the
plan, so the tensor a host loads into has the saved shape whatever the run's length.
"""
from __future__ import annotations

import json

from .. import checkpoint as ckpt
from ..checkpoint.schema import CARRY_KEY, MAX_CARRIED
from ..engine.carry import carrier_indexes

MIN_CAPACITY = 1 << 16  # bytes


def state_capacity(plan) -> int:
    """Bytes that hold any checkpoint of ``plan``'s config: a power of two >= 64 KiB that fits every lane at the
    largest counters, carrying the most documents its packing may carry across a flush (each ``Pack``'s
    ``max_carry``, every one in a bin of its own at the largest position and piece; a concat ``Pack``'s remainder,
    up to ``max_length`` documents of one token, the first one cut at the largest offset). ``plan``: an
    ``engine.LoaderPlan``."""
    big, piece = (1 << 62) - 1, (1 << 31) - 1

    def most(op) -> list:
        n = op.max_carried() if hasattr(op, "max_carried") else getattr(op, "max_carry", MAX_CARRIED)
        if getattr(op, "method", None) == "concat":
            return [[[big, piece, piece]] + [[big, piece]] * (n - 1)] if n else []
        return [[[big, piece]]] * n
    carry = {str(i): most(plan.chain_ops[i]) for i in sorted(carrier_indexes(plan.chain_ops))}
    carry = {k: bins for k, bins in carry.items() if bins}
    extra = {CARRY_KEY: carry} if carry else {}
    entries = [dict({k: (lane if k == "lane" else big) for k in ckpt.LANE_KEYS}, **extra)
               for lane in range(plan.canonical_replicas)]
    n = len(ckpt.canonical_json(plan.make_state(entries)))
    cap = MIN_CAPACITY
    while cap < n:
        cap <<= 1
    return cap


def encode_state(state: dict, capacity: int) -> bytes:
    """``state``'s canonical JSON, zero-padded to ``capacity`` bytes.

    Raises ``CheckpointError`` when the JSON does not fit (naming both sizes)."""
    raw = ckpt.canonical_json(state).encode()
    if len(raw) > capacity:
        raise ckpt.CheckpointError(f"the checkpoint's JSON is {len(raw)} bytes, more than the {capacity} reserved "
                                   f"for it")
    return raw + b"\0" * (capacity - len(raw))


def decode_state(raw: bytes) -> dict:
    """The checkpoint ``encode_state`` wrote (trailing zero bytes ignored).

    Raises ``CheckpointError`` when the bytes are not a JSON object."""
    try:
        state = json.loads(bytes(raw).rstrip(b"\0"))
    except ValueError as e:
        raise ckpt.CheckpointError(f"data loader state is not valid JSON: {e}") from None
    if not isinstance(state, dict):
        raise ckpt.CheckpointError(f"data loader state is JSON {type(state).__name__}, not an object")
    return state
