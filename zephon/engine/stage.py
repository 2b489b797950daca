"""The worker stage: sample pointers -> records through the stateless operators.

Runs on any worker (inline, thread or process). Output depends only on the pointers, never on which
worker ran it or how a chunk was cut into units.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ..formats import DataError
from ..ops.base import RecordError

MAX_REPORTED = 20  # skipped-sample messages kept per unit for the report


@dataclass
class UnitResult:
    """What a worker returns for one unit: records in pointer order, counts, and the ``DataError`` of
    bad input (returned, not raised, so the pump raises it in sequence order)."""
    records: list = field(default_factory=list)
    skipped: int = 0
    skipped_messages: list = field(default_factory=list)
    filtered: int = 0
    error: DataError | None = None


def error_for(datasets, src, message: str) -> DataError:
    """A ``DataError`` naming file, shard and sample for an element identity ``(d, s, i, position)``."""
    if src is None:
        return DataError(message)
    d, s, i = src[0], src[1], src[2]
    ds = datasets[d]
    return DataError(f"dataset {ds.name!r}: {message}", path=ds.shards[s].path, shard=s, sample=i)


class WorkStage:
    """``datasets`` (formats.Dataset list, indexed by dataset id) and the stateless operators that
    precede the first accumulator. Picklable: the processes runner ships it once per worker."""

    def __init__(self, datasets, ops):
        self.datasets = list(datasets)
        self.ops = list(ops)

    def fingerprint(self) -> list:
        """Plain data identifying what this stage computes (datasets and operators)."""
        return [d.fingerprint() for d in self.datasets] + [op.fingerprint() for op in self.ops]

    def run(self, ptrs) -> UnitResult:
        """``ptrs``: a ``work.ChunkPointers`` slice. Returns a ``UnitResult``; never raises for bad data."""
        res = UnitResult()
        try:
            records = self._read(ptrs, res)
            for op in self.ops:
                before = len(records)
                records = self._apply(op, records, res)
                if op.name == "filter":
                    res.filtered += before - len(records)
            res.records = records
        except RecordError as e:
            res.error = error_for(self.datasets, e.src, str(e))
        except DataError as e:
            res.error = e
        return res

    def _apply(self, op, records: list, res: UnitResult) -> list:
        """``op.process_many``; a record it rejects is skipped and counted when its dataset was opened
        with ``on_error="skip"`` (then the op runs again on the rest), else the error propagates."""
        while True:
            try:
                return op.process_many(records)
            except RecordError as e:
                if e.src is None or self.datasets[e.src[0]].on_error != "skip":
                    raise
                err = error_for(self.datasets, e.src, str(e))
                res.skipped += 1
                if len(res.skipped_messages) < MAX_REPORTED:
                    res.skipped_messages.append(str(err))
                kept = [r for r in records if r.get("__src__") != e.src]
                if len(kept) == len(records):
                    raise
                records = kept

    def _read(self, ptrs, res: UnitResult) -> list:
        n = len(ptrs)
        records: list = [None] * n
        keys = ptrs.dataset_ids * (1 << 32) + ptrs.shard_ids
        for key in np.unique(keys):
            where = np.flatnonzero(keys == key)
            d, s = int(key >> 32), int(key & 0xFFFFFFFF)
            idx = ptrs.sample_idx[where].tolist()
            for w, i, rec in zip(where.tolist(), idx, self.datasets[d].read(s, idx)):
                rec["__src__"] = (d, s, i, int(ptrs.positions[w]))
                records[w] = rec
        good = []
        for rec in records:
            if "__error__" in rec:
                res.skipped += 1
                if len(res.skipped_messages) < MAX_REPORTED:
                    res.skipped_messages.append(rec["__error__"])
            else:
                good.append(rec)
        return good
