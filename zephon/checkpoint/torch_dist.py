"""Checkpoint aggregation over an initialised torch.distributed process group.

Each rank's ``Loader.checkpoint()`` travels as canonical JSON bytes in uint8 tensors over a dedicated gloo
group (CPU), so the same code serves gloo and NCCL jobs and never pickles: a received checkpoint is data,
decoding it cannot run code (which ``all_gather_object`` would allow). torch is imported lazily; the
rest of Zephon imports without it.
"""
from __future__ import annotations

import json
import math
import os
import re
import time
from datetime import timedelta

from .merge import merge_states
from .schema import CheckpointError, canonical_json
from .aggregate import AggregationError, Aggregator

_KEY_PREFIX = "zephon-agg"
# Rank 0's gloo message after a monitored barrier failed: "[Rank 0]: Ranks 1, 3 failed to pass monitoredBarrier".
_FAILED_RANKS = re.compile(r"Ranks? ([\d, ]+) failed to pass monitoredBarrier")
# A non-zero rank's message when rank 0 (the barrier's coordinator) went away.
_FROM_RANK = re.compile(r"send/recv from rank (\d+)")


class TorchDistAggregator(Aggregator):
    """Collective checkpoint aggregation for jobs with an initialised ``torch.distributed`` process group.

    Construct it on every rank of ``group`` (it is a collective call): it creates a dedicated gloo
    group over those ranks (``dist.new_group(backend="gloo", timeout=timeout)``), so checkpoints move on
    CPU whatever the main backend. Every rank then calls ``gather`` once per checkpoint.

    Args:
        group: the process group whose ranks aggregate (None: the default, whole-job group). A subgroup
            is created with ``use_local_synchronization=True``: only its members construct.
        timeout: seconds a rank waits for the others (barrier, payload exchange); > 0.
        run_id: named in errors (default: ``$TORCHELASTIC_RUN_ID``, else ``"unnamed"``).
    Attributes: ``rank``, ``world_size`` (within ``group``), ``timeout``, ``run_id``.
    Raises ``RuntimeError`` if torch.distributed is unavailable or not initialised, ``ValueError`` for a
    bad timeout.
    """

    _constructions = 0  # per process; every rank constructs in the same order (a collective call)

    def __init__(self, group=None, timeout: float = 300.0, *, run_id: str | None = None):
        import torch.distributed as dist

        if not (dist.is_available() and dist.is_initialized()):
            raise RuntimeError("TorchDistAggregator needs an initialised torch.distributed process group "
                               "(call torch.distributed.init_process_group first, or use DirectoryAggregator)")
        if not isinstance(timeout, (int, float)) or not math.isfinite(timeout) or timeout <= 0:
            raise ValueError(f"timeout must be a finite number of seconds > 0, got {timeout!r}")
        self.timeout = float(timeout)
        self.run_id = run_id or os.environ.get("TORCHELASTIC_RUN_ID") or "unnamed"
        self._dist = dist
        self._global_ranks = (list(range(dist.get_world_size())) if group is None
                              else list(dist.get_process_group_ranks(group)))
        try:  # presence keys in the job's store tell survivors who never arrived (private API: optional)
            from torch.distributed.distributed_c10d import _get_default_store
            self._store = _get_default_store()
        except Exception:  # noqa: BLE001 - no store, missing ranks are then only what rank 0 reports
            self._store = None
        # Building the side group is itself a rendezvous (usually at the job's first checkpoint): a rank
        # that never comes must be named here too, not left to a store timeout listing internal keys.
        TorchDistAggregator._constructions += 1
        self._round = 0
        self.rank, self.world_size = self._global_ranks.index(dist.get_rank()), len(self._global_ranks)
        key = f"{_KEY_PREFIX}/init/{TorchDistAggregator._constructions}/"
        start = time.monotonic()
        self._store_call("set", key + str(self.rank), "1")
        try:
            self._pg = dist.new_group(ranks=None if group is None else self._global_ranks, backend="gloo",
                                      timeout=timedelta(seconds=self.timeout),
                                      use_local_synchronization=group is not None)
        except Exception as e:  # noqa: BLE001 - DistStoreError / RuntimeError variants
            missing = self._missing(str(e), key, start)
            raise self._error("did not join the checkpoint aggregation (building its gloo group)", missing,
                              e) from e
        self.rank = dist.get_rank(self._pg)
        self.world_size = dist.get_world_size(self._pg)
        self._round = 0
        self._prefix = f"{_KEY_PREFIX}/{getattr(self._pg, 'group_name', 'g')}"

    def gather(self, rank: int, state: dict) -> dict:
        """Contribute this rank's ``state`` (``Loader.checkpoint()``, a JSON dict) and return the merged
        global checkpoint (``merge_states`` of every rank's state, in rank order), the same dict on every
        rank, after one call on each.

        ``rank``: this process's rank within the group (checked). Blocks up to ``timeout`` seconds
        for the others. Raises ``AggregationError`` (naming missing ranks, the timeout and the run) if a
        rank does not arrive or the exchange fails; ``CheckpointError`` if the states do not merge
        (missing or conflicting lanes, other configs: raised on every rank alike) or ``state`` is not
        JSON data. After an ``AggregationError`` the group has lost a rank: discard this aggregator
        (rounds are counted per rank, a rank that never called has not counted the failed one).
        """
        dist = self._dist
        if rank != self.rank:
            raise CheckpointError(f"gather(rank={rank}) on the process that is rank {self.rank} of the "
                                  f"aggregation group ({self.world_size} ranks)")
        try:
            payload = canonical_json(state).encode()
        except (TypeError, ValueError) as e:
            raise CheckpointError(f"rank {rank}: the state is not JSON data ({e})") from None
        self._round += 1
        key = f"{self._prefix}/{self._round}/"
        start = time.monotonic()
        self._store_call("set", key + str(rank), "1")
        try:  # a dead or late rank fails here with a clear list (gloo: wait_all_ranks collects every one)
            dist.monitored_barrier(self._pg, timedelta(seconds=self.timeout), wait_all_ranks=True)
        except Exception as e:  # noqa: BLE001 - torch raises RuntimeError / DistBackendError variants
            missing = self._missing(str(e), key, start)
            raise self._error("did not join the checkpoint aggregation", missing, e) from e
        self._store_call("delete_key", key + str(rank))  # all arrived: the key is no longer needed
        try:
            payloads = exchange_payloads(dist, payload, self._pg)
        except Exception as e:  # noqa: BLE001
            raise self._error("failed during the payload exchange (after every rank had joined)", [], e) from e
        states = decode_payloads(payloads)
        # Round-trip through JSON so every rank returns an equal dict (tuples become lists everywhere).
        return json.loads(canonical_json(merge_states(states)))

    # -- failure reporting ----------------------------------------------------------------------
    def _missing(self, message: str, key: str, start: float) -> list[int]:
        """Ranks that did not arrive: rank 0's report if this is rank 0's error, else the presence keys
        absent from the store once the timeout has elapsed (a peer may still be on its way when a
        connection error arrives early), else empty (unknown)."""
        m = _FAILED_RANKS.search(message)
        if m:
            return sorted({int(x) for x in m.group(1).replace(" ", "").split(",") if x})
        if self._store is None:
            return []
        deadline = start + self.timeout
        while True:
            present = [self._store_call("check", [key + str(r)]) for r in range(self.world_size)]
            if any(p is None for p in present):  # store unreachable: it may have lived in the dead rank
                m = _FROM_RANK.search(message)
                return [int(m.group(1))] if m else []
            missing = [r for r, p in enumerate(present) if not p]
            if not missing or time.monotonic() >= deadline:
                break
            time.sleep(0.1)
        if not missing:  # everyone arrived, then the coordinator's connection broke
            m = _FROM_RANK.search(message)
            return [int(m.group(1))] if m else []
        return missing

    def _error(self, what: str, missing: list[int], cause: Exception) -> AggregationError:
        if missing:
            glob = [self._global_ranks[r] for r in missing if r < len(self._global_ranks)]
            who = f"ranks {missing}" + (f" (global ranks {glob})" if glob != missing else "")
        else:
            who = "a rank (which one is unknown)"
        first_line = str(cause).strip().splitlines()[0] if str(cause).strip() else type(cause).__name__
        return AggregationError(
            f"checkpoint aggregation round {self._round} of run {self.run_id!r} (rank {self.rank} of "
            f"{self.world_size}, timeout {self.timeout:g} s): {who} {what}; torch said: {first_line}",
            missing, self.timeout, self.run_id)

    def _store_call(self, name: str, *args):
        """A store operation that never raises: None when the store is gone or lacks the method."""
        if self._store is None:
            return None
        try:
            return getattr(self._store, name)(*args)
        except Exception:  # noqa: BLE001 - a store hosted by a dead rank raises connection errors
            return None


def exchange_payloads(dist, payload: bytes, group, dst: int | None = None) -> list[bytes] | None:
    """Every rank's ``payload`` (bytes), in the group's rank order: on every rank (``dst`` None: two
    ``all_gather``) or on global rank ``dst`` only (two ``gather``; the others get None). A collective over
    ``group`` (a gloo group: the tensors are CPU uint8, padded to the longest payload)."""
    torch = _torch()
    n = dist.get_world_size(group)
    mine = dist.get_rank() == dst
    size = torch.tensor([len(payload)], dtype=torch.int64)
    if dst is None:
        sizes = [torch.zeros(1, dtype=torch.int64) for _ in range(n)]
        dist.all_gather(sizes, size, group=group)
    else:  # the others' lengths travel to dst only; each pads to the longest, which dst alone knows: send it back
        sizes = [torch.zeros(1, dtype=torch.int64) for _ in range(n)] if mine else None
        dist.gather(size, sizes, dst=dst, group=group)
        longest = torch.tensor([max(int(s.item()) for s in sizes) if mine else 0], dtype=torch.int64)
        dist.broadcast(longest, src=dst, group=group)
    lengths = [int(s.item()) for s in sizes] if sizes is not None else None
    width = max(lengths) if dst is None else int(longest.item())
    buf = torch.zeros(max(width, 1), dtype=torch.uint8)  # gather needs equal shapes: pad
    buf[:len(payload)] = torch.frombuffer(bytearray(payload), dtype=torch.uint8)
    parts = [torch.empty_like(buf) for _ in range(n)] if dst is None or mine else None
    if dst is None:
        dist.all_gather(parts, buf, group=group)
    else:
        dist.gather(buf, parts, dst=dst, group=group)
    if parts is None:
        return None
    return [t[:k].numpy().tobytes() for k, t in zip(lengths, parts)]


def decode_payloads(payloads: list[bytes]) -> list[dict]:
    """The JSON states ``exchange_payloads`` brought, in rank order. Raises ``CheckpointError`` naming the rank
    whose payload is not JSON."""
    states = []
    for r, raw in enumerate(payloads):
        try:
            states.append(json.loads(raw))
        except ValueError as e:
            raise CheckpointError(f"rank {r}'s checkpoint payload is not valid JSON: {e}") from None
    return states


def _torch():
    import torch

    return torch
