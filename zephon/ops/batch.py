"""Batching rows into micro-batches.

The engine groups each lane's rows: a global step takes ``global_batch_size / canonical_replicas``
rows from every lane, split into micro-batches of ``micro_batch_size`` rows (gradient accumulation
covers the rest), so the micro-batch size may change between runs without changing a global batch.
"""
from __future__ import annotations

import numpy as np

from .base import Operator


LABEL_PAD = -100  # the label a loss ignores (torch's cross_entropy ignore_index)


class Batch(Operator):
    """Terminal operator: ``micro_batch_size`` rows per micro-batch.

    Args:
        micro_batch_size: rows per micro-batch (a runtime knob, not in the checkpoint identity).
        drop_last: at the end of a finite stream, drop (and count) the incomplete last step.
        short_last: with ``drop_last=False``, the last step(s) of a finite pass carry only real rows, as torch's
            ``DataLoader(drop_last=False)`` gives a short last batch: a lane whose pass ended gives no row, a lane
            with fewer rows than a step gives a short micro-batch, and the pass is split so lanes end on whole
            rows (``work.balance``). Default False: those lanes get padding rows (``padding_row``) instead, so
            every step has its full shape on every lane and rank (what hosts with fixed shapes need: compiled
            steps, Megatron's fixed micro-batch count). Under ``host.RankSession`` a rank with no row in a
            step still takes part in it (a 0-row micro-batch); see docs/concepts.md ("finite passes").
    ``drop_last`` and ``short_last`` are in the checkpoint identity. Raises ``ValueError`` for
    ``micro_batch_size < 1`` or ``short_last`` with ``drop_last``."""

    name = "batch"

    def __init__(self, micro_batch_size: int = 1, drop_last: bool = True, short_last: bool = False):
        if micro_batch_size < 1:
            raise ValueError(f"micro_batch_size must be >= 1, got {micro_batch_size}")
        if short_last and drop_last:
            raise ValueError("Batch(short_last=True) shortens the last step of a finite pass instead of dropping "
                             "it: use it with drop_last=False")
        self.micro_batch_size, self.drop_last, self.short_last = micro_batch_size, drop_last, bool(short_last)

    def fingerprint(self) -> dict:
        return {"op": self.name, "drop_last": self.drop_last, **({"short_last": True} if self.short_last else {})}


def collate(rows: list[dict]) -> dict:
    """Stack rows into a micro-batch: numpy arrays of equal shape become ``[rows, ...]`` arrays (writable, sharing
    memory with no other micro-batch); other values (``cu_seqlens`` of varying length, ``__src__``, numbers) become
    lists of length ``rows``."""
    out = {}
    if len(rows) == 1:  # the common micro-batch of one packed row: no shapes to compare (next() runs this)
        for k, v in rows[0].items():
            if not isinstance(v, np.ndarray):
                out[k] = [v]
            elif v.base is None and v.flags.writeable:
                # A row that owns its array (what Pack and Tokenize make): a view, as torch's batch_size=None
                # hands arrays over; the row is freed once delivered. Copying cache-cold rows was most of next().
                out[k] = v[None]
            else:  # a view into a shared block (a transport's stacked column) or read-only memory: a private copy
                out[k] = v[None].copy()
        return out
    for k in rows[0]:
        vals = [r[k] for r in rows]
        v0 = vals[0]
        if isinstance(v0, np.ndarray) and all(isinstance(v, np.ndarray) and v.shape == v0.shape for v in vals):
            out[k] = np.array(vals)  # stacks equal-shaped arrays into a new one as np.stack does, in C
        else:
            out[k] = vals
    return out


def padding_row(template: dict) -> dict:
    """A row that trains nothing, shaped like ``template`` (a delivered row): numpy arrays of the same shape
    and dtype filled with 0, except ``labels`` (``LABEL_PAD`` where the dtype is signed) and
    ``attention_mask`` (0: the marker of a padding row); ``num_tokens`` 0, ``__src__`` an empty list,
    strings empty, other numbers 0."""
    row = {}
    for k, v in template.items():
        if k == "cu_seqlens" and isinstance(v, np.ndarray):
            row[k] = np.zeros(1, dtype=v.dtype)  # no document: the same on every rank, whatever was copied
        elif isinstance(v, np.ndarray):
            fill = LABEL_PAD if k == "labels" and np.issubdtype(v.dtype, np.signedinteger) else 0
            row[k] = np.full_like(v, fill)
        elif k == "__src__" or isinstance(v, (list, tuple)):
            row[k] = []
        elif isinstance(v, str):
            row[k] = ""
        elif isinstance(v, bytes):
            row[k] = b""
        else:
            row[k] = type(v)() if isinstance(v, (int, float, bool, np.generic)) else None
    if "attention_mask" not in row and isinstance(template.get("input_ids"), np.ndarray):
        row["attention_mask"] = np.zeros(template["input_ids"].shape, dtype=np.uint8)
    return row


def empty_micro_batch(template: dict) -> dict:
    """A micro-batch of no row shaped like ``template`` (a collated micro-batch): its arrays with a leading
    dimension of 0 (same trailing shape and dtype), lists empty; bookkeeping keys (``__lane__``...) left out."""
    return {k: (v[:0].copy() if isinstance(v, np.ndarray) else []) for k, v in template.items()
            if not k.startswith("__") or k == "__src__"}


def padding_micro_batch(template: dict, rows: int) -> dict:
    """A micro-batch of ``rows`` padding rows shaped like a row of ``template`` (a collated micro-batch whose
    bookkeeping keys, ``__lane__`` and the like, are removed first)."""
    first = {k: v[0] for k, v in template.items() if not k.startswith("__") or k == "__src__"}
    return collate([padding_row(first)] * rows)
