"""The worker stage: sample pointers -> records through the stateless operators.

Runs on any worker (inline, thread or process). Output depends only on the pointers, never on which
worker ran it or how a chunk was cut into units.
"""
from __future__ import annotations

import os
import time
from dataclasses import dataclass, field

import numpy as np

from ..formats import DataError
from ..formats.remote.fetch import unreported
from ..ops.base import RecordError
from ..formats.records import ERROR, SRC, Src, src_of

MAX_REPORTED = 20  # skipped-sample messages kept per unit for the report
FIRST_SKIPS = 3  # per dataset, the skip messages a SkipLedger error quotes


@dataclass
class UnitResult:
    """What a worker returns for one unit: records in pointer order, counts, and the ``DataError`` of
    bad input (returned, not raised, so the pump raises it in sequence order). ``seen``, ``skipped_by``,
    ``kept_by``: per dataset id, the unit's pointers, samples skipped (``on_error="skip"``) and records out
    of the worker stage; ``first_skips``: per dataset id, its first skip messages (plain data, for
    ``SkipLedger``)."""
    records: list = field(default_factory=list)
    skipped: int = 0
    skipped_messages: list = field(default_factory=list)
    filtered: int = 0
    error: DataError | None = None
    seen: dict = field(default_factory=dict)
    skipped_by: dict = field(default_factory=dict)
    kept_by: dict = field(default_factory=dict)
    first_skips: dict = field(default_factory=dict)
    times: dict = field(default_factory=dict)       # seconds per stage ("read", then each operator's name)
    pid: int = 0                                    # the process that ran the unit
    remote: dict = field(default_factory=dict)      # that process's object-storage counts not reported before

    def skip(self, d: int, message: str) -> None:
        """Count one skipped sample of dataset ``d`` (``on_error="skip"``), keeping the first messages."""
        self.skipped += 1
        self.skipped_by[d] = self.skipped_by.get(d, 0) + 1
        if len(self.skipped_messages) < MAX_REPORTED:
            self.skipped_messages.append(message)
        mine = self.first_skips.setdefault(d, [])
        if len(mine) < FIRST_SKIPS:
            mine.append(message)


def error_for(datasets, src, message: str) -> DataError:
    """A ``DataError`` naming file, shard and sample for a source sample's identity ``src`` (a ``Src``)."""
    if src is None:
        return DataError(message)
    ds = datasets[src.dataset]
    try:  # JSONL: the line too, as a malformed line's error has it
        line = ds.locate(src.shard, src.sample).get("line")
    except Exception:  # an error path: a file that no longer reads must not hide the error being reported
        line = None
    return DataError(f"dataset {ds.name!r}: {message}", path=ds.shards[src.shard].path, shard=src.shard,
                     sample=src.sample, line=line)


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
        times, clock = res.times, time.perf_counter
        try:
            t = clock()
            records = self._read(ptrs, res)
            times["read"] = (t1 := clock()) - t
            for op in self.ops:
                before = len(records)
                records = self._apply(op, records, res)
                times[op.name] = times.get(op.name, 0.0) + (t := clock()) - t1
                t1 = t
                if op.name == "filter":
                    res.filtered += before - len(records)
            res.records = records
            kept = res.kept_by
            for r in records:
                d = src_of(r).dataset
                kept[d] = kept.get(d, 0) + 1
        except RecordError as e:
            res.error = error_for(self.datasets, e.src, str(e))
        except DataError as e:
            res.error = e
        res.pid, res.remote = os.getpid(), unreported()  # a worker process's downloads reach the loader's metrics
        return res

    def hint(self, ptrs) -> None:
        """Tell each dataset which of its shards ``ptrs`` will read, in the order they come (read-ahead;
        ``Dataset.prefetch``). Changes what is cached, never what is read; never raises."""
        keys = ptrs.dataset_ids * (1 << 32) + ptrs.shard_ids
        _, first = np.unique(keys, return_index=True)
        wanted: dict = {}
        for key in keys[np.sort(first)].tolist():
            wanted.setdefault(key >> 32, []).append(key & 0xFFFFFFFF)
        for d, shards in wanted.items():
            try:
                self.datasets[d].prefetch(shards)
            except Exception:  # a hint; the read reports any real problem
                pass

    def _apply(self, op, records: list, res: UnitResult) -> list:
        """``op.process_many``; a record it rejects is skipped and counted when its dataset was opened
        with ``on_error="skip"`` (then the op runs again on the rest), else the error propagates."""
        while True:
            try:
                return op.process_many(records)
            except RecordError as e:
                if e.src is None or self.datasets[e.src.dataset].on_error != "skip":
                    raise
                res.skip(e.src.dataset, str(error_for(self.datasets, e.src, str(e))))
                kept = [r for r in records if r.get(SRC) != e.src]
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
            res.seen[d] = res.seen.get(d, 0) + len(idx)
            for w, i, rec in zip(where.tolist(), idx, self.datasets[d].read(s, idx)):
                rec[SRC] = Src(d, s, i, int(ptrs.positions[w]))
                records[w] = rec
        good = []
        for rec in records:
            if ERROR in rec:
                res.skip(rec[SRC].dataset, rec[ERROR])
            else:
                good.append(rec)
        return good


MIN_SEEN = 100  # samples of a dataset seen before its skip fraction is judged (all of them when fewer)
DEFAULT_MAX_SKIP_FRACTION = 0.5


class SkipLedger:
    """Per-dataset counts of what the worker stage processed for one loader, with limits.

    Args:
        datasets: ``formats.Dataset`` list (indexed by dataset id).
        max_skip_fraction: float in [0, 1], or one per dataset: the largest share of a dataset's samples
            that ``on_error="skip"`` may skip; judged once ``min(MIN_SEEN, share)`` of its samples were seen.
        share: per dataset, the samples one pass of it gives this loader's lanes (its size times owned lanes
            over all lanes, rounded up), the most the skip fraction waits for. sizes: samples per dataset.
        endless: an endless stream (``exhaustion="repeat"``): a dataset that gives no record from as many
            samples as it holds is an error (a finite pass just ends; other ranks may hold its records).
    ``add(res)`` takes a ``UnitResult`` and raises ``DataError`` naming the dataset (its first file), the skip
    fraction and its first skip messages when a limit is passed, or when a whole pass of the dataset gave no
    record (every sample skipped or filtered: it would silently contribute nothing, or alone, never end)."""

    def __init__(self, datasets, max_skip_fraction, share, sizes, endless: bool = True):
        n = len(datasets)
        self.datasets = datasets
        limits = list(max_skip_fraction) if isinstance(max_skip_fraction, (list, tuple)) else [max_skip_fraction] * n
        if len(limits) != n or not all(isinstance(x, (int, float)) and 0 <= x <= 1 for x in limits):
            raise ValueError(f"max_skip_fraction must be a number in [0, 1] or one per dataset ({n}), "
                             f"got {max_skip_fraction!r}")
        self.limits = [float(x) for x in limits]
        self.share = [max(1, int(x)) for x in share]
        self.sizes = [int(x) for x in sizes]
        self.endless = endless
        self.seen, self.skipped, self.kept = [0] * n, [0] * n, [0] * n
        self.messages: list[list[str]] = [[] for _ in range(n)]

    def add(self, res: UnitResult) -> None:
        for d, k in res.skipped_by.items():
            self.skipped[d] += k
        for d, k in res.kept_by.items():
            self.kept[d] += k
        for d, msgs in res.first_skips.items():
            self.messages[d] += msgs[:FIRST_SKIPS - len(self.messages[d])]
        for d, k in res.seen.items():
            self.seen[d] += k
            self._check(d)

    def _check(self, d: int) -> None:
        seen, skipped = self.seen[d], self.skipped[d]
        ds = self.datasets[d]
        shards = getattr(ds, "shards", ())
        where = f"dataset {getattr(ds, 'name', d)!r} ({shards[0].path if shards else 'no files'})"
        first = "; ".join(self.messages[d]) or "none kept"
        if skipped and seen >= min(MIN_SEEN, self.share[d]) and skipped / seen > self.limits[d]:
            raise DataError(f"{where}: {skipped} of the first {seen} samples read were skipped "
                            f"(on_error='skip'), a fraction of {skipped / seen:.2f} > max_skip_fraction="
                            f"{self.limits[d]}; first errors: {first}. Fix the data or the reader options "
                            f"(field name, columns, format), or raise max_skip_fraction (Loader keyword; a "
                            f"list gives one per dataset) if that many bad samples are expected")
        if self.endless and seen >= max(1, self.sizes[d]) and not self.kept[d]:
            filtered = seen - skipped
            raise DataError(f"{where}: gave no record from {seen} samples read (it holds {self.sizes[d]}: "
                            f"{skipped} skipped, {filtered} filtered out); it would contribute nothing (or, "
                            f"alone, the loader would never yield). First errors: {first}. Check on_error, "
                            f"the field name and the filters")
