"""Grouped batching: rows of one group per batch, each group's batch filling on its own (a per-lane accumulator).

A key function gives each row its group and that group's batch size; a row joins its group's bucket and a
bucket that reaches its batch size is emitted as one record (the batch). Buckets live per lane, so groups
form in the lane's order whatever the world size (Energon's ``GroupBatchDataset`` forms them per worker).
At a flush sentinel the buckets are carried into the next span (named by identity in the lane's checkpoint,
as packing's open bins are); past ``max_carry`` held rows the fullest buckets are emitted short. At the end
of a lane the short buckets are emitted (oldest group first) or, with ``drop_last``, dropped and counted.
See docs/energon.md (grouped batching).
"""
from __future__ import annotations

from .base import Accumulator, Operator, RecordError
from ..formats.records import SRC, piece_ref

GROUP_ROWS = "rows"  # the field of a group batch record holding its member records, in arrival order


def _refs(record: dict) -> list:
    """The source pieces of a member record (a combined row's list, or the record's own identity)."""
    src = record[SRC]
    return list(src) if isinstance(src, list) else [piece_ref(record)]


class GroupBatch(Operator):
    """Accumulator operator: rows -> group batches ``{"rows": [member records], "__src__": [PieceRef ...]}``.

    Args:
        key_fn: ``record -> (group key, batch size)``; the key is hashable, the size an int >= 1 (the same
            for every row of a group); ``None`` drops the row (counted in ``dropped``).
        key_name: a stable name of ``key_fn`` (``module.qualname``) for the fingerprint.
        drop_last: at the end of a lane, drop the short buckets (counted in ``dropped``) instead of emitting them.
        max_carry: rows held across a flush sentinel (each costs one or two integers in the lane's checkpoint).
    Raises ``RecordError`` when a group's batch size changes or is not an int >= 1."""

    name = "group_batch"

    def __init__(self, key_fn, *, key_name: str, drop_last: bool = False, max_carry: int = 4096):
        if not isinstance(max_carry, int) or max_carry < 0:
            raise ValueError(f"max_carry must be an int >= 0, got {max_carry!r}")
        self.key_fn, self.key_name = key_fn, key_name
        self.drop_last, self.max_carry = bool(drop_last), max_carry
        self.dropped = 0  # rows dropped (drop_last, or key_fn gave None) in this process (statistics)

    def fingerprint(self) -> dict:
        return {"op": self.name, "key": self.key_name, "drop_last": self.drop_last, "max_carry": self.max_carry}

    def new_accumulator(self, lane: int) -> "GroupBatchAccumulator":
        return GroupBatchAccumulator(self)


class GroupBatchAccumulator(Accumulator):
    def __init__(self, op: GroupBatch):
        self.op = op
        self.buckets: dict = {}  # group key -> (batch size, rows); insertion order = first seen in the span
        self.sizes: dict = {}    # group key -> batch size (checked for every row)

    def push(self, record: dict) -> list[dict]:
        got = self.op.key_fn(record)
        if got is None:
            self.op.dropped += 1
            return []
        key, size = got
        if not isinstance(size, int) or isinstance(size, bool) or size < 1:
            raise RecordError(f"group {key!r}: batch size must be an int >= 1, got {size!r}", record)
        known = self.sizes.setdefault(key, size)
        if known != size:
            raise RecordError(f"group {key!r}: batch size {size} differs from the {known} given before", record)
        rows = self.buckets.setdefault(key, [])
        rows.append(record)
        if len(rows) >= size:
            del self.buckets[key]
            return [self._batch(rows)]
        return []

    def flush(self) -> list[dict]:
        buckets, self.buckets, self.sizes = self.buckets, {}, {}
        if self.op.drop_last:
            self.op.dropped += sum(len(rows) for rows in buckets.values())
            return []
        return [self._batch(rows) for rows in buckets.values()]

    def carry(self) -> tuple[list[dict], list[list[dict]]]:
        """At a flush sentinel: emit the fullest buckets short (oldest on ties) until at most ``max_carry`` rows
        are held; return ``(batches, buckets)``, the held buckets' rows, oldest group first."""
        out = []
        while sum(len(r) for r in self.buckets.values()) > self.op.max_carry:
            key = max(self.buckets, key=lambda k: len(self.buckets[k]))  # max keeps the first (oldest) on ties
            out.append(self._batch(self.buckets.pop(key)))
        self.sizes = {k: self.sizes[k] for k in self.buckets}  # what a resume knows: the held groups only
        return out, [list(rows) for rows in self.buckets.values()]

    def resume(self, buckets: list[list[dict]]) -> None:
        """Refill the buckets (lists of rows, as ``carry`` returned them) in that order, as if carried."""
        self.buckets, self.sizes = {}, {}
        for rows in buckets:
            for r in rows:
                self.push(r)  # never reaches a batch size: each bucket was short when carried

    @staticmethod
    def _batch(rows: list[dict]) -> dict:
        return {GROUP_ROWS: rows, SRC: [ref for r in rows for ref in _refs(r)]}
