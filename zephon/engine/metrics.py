"""``Loader.metrics()``: what the loader did and where its time went, counted as it runs (a few additions per unit
of work and per micro-batch, always on). Exporters (callback, TensorBoard, Prometheus) are in
``zephon.host.metrics``; see docs/metrics.md.

Per-dataset samples and tokens count what was delivered, read off the delivered rows themselves: a row names its
source pieces (``__src__``, as ``explain`` reads them), a packed row their tokens (``cu_seqlens``), and concat
packing, asked to (``mark_offsets``), where each piece starts in its document; a piece's dataset follows from its
stream position (``WorkSource.dataset_ids``). So the counts never depend on read-ahead, replay or timing.
"""
from __future__ import annotations

import os
import threading
import time
from typing import NamedTuple

import numpy as np

from ..formats.records import DOC_OFFSETS, PIECE, SRC
from ..formats.remote import stats as remote_stats
from ..ops.group import GROUP_ROWS

# packed pieces gathered before they are counted (a few hundred best-fit micro-batches; snapshot counts the rest)
PACKED_BATCH = 8192
#: ``metrics()["remote"]``: object-storage counts (``formats.remote.stats``) since the loader was built
REMOTE_KEYS = ("downloads", "downloaded_bytes", "range_reads", "range_bytes", "cache_hits", "cache_misses", "retries")


class MetricsCounter:
    """The counts behind ``Loader.metrics()`` (one per Loader; they survive its iterations and restores).

    num_datasets: datasets of the loader. Workers' per-unit counts arrive through ``add_unit`` (on the pump), the
    pump's own time through ``add_pump``, delivered micro-batches through ``add_micro_batch`` (with their rows: the
    per-dataset counts), the consumer's wait through ``add_wait``."""

    def __init__(self, num_datasets: int):
        self._lock = threading.Lock()  # metrics() may be read from another thread (a Prometheus endpoint)
        self.started = time.perf_counter()
        self.samples = np.zeros(num_datasets, np.int64)  # documents whose first token was delivered, per dataset
        self.tokens = np.zeros(num_datasets, np.int64)   # tokens delivered, per dataset
        # packed rows' pieces not yet in samples/tokens (counted in batches of PACKED_BATCH, and by snapshot)
        self._packed, self._packed_source = _Packed(), None
        self.units = 0
        self.stage_s: dict[str, float] = {}  # seconds per stage: read, each worker operator, each pump operator
        self.worker_s = 0.0                  # seconds workers spent on units (all stages)
        self.rows = self.padding_rows = self.micro_batches = 0
        self.row_tokens = self.row_slots = 0  # tokens in delivered rows, and their capacity (rows x row length)
        self.wait_s = 0.0                     # seconds the consumer waited inside next()
        self.remote0 = remote_stats()         # this process's object-storage counts when the loader was built
        self.remote_workers: dict[str, int] = {}  # those of worker processes (the processes runner)

    def add_unit(self, res) -> None:
        """Count a worker's ``UnitResult`` as the pump releases it."""
        with self._lock:
            self.units += 1
            for name, s in res.times.items():
                self.stage_s[name] = self.stage_s.get(name, 0.0) + s
                self.worker_s += s
            if res.pid != os.getpid():  # this process's own counts are read directly
                for k, n in res.remote.items():
                    self.remote_workers[k] = self.remote_workers.get(k, 0) + n

    def add_pump(self, name: str, seconds: float) -> None:
        """``seconds`` the pump spent in accumulator ``name``."""
        with self._lock:
            self.stage_s[name] = self.stage_s.get(name, 0.0) + seconds

    def add_micro_batch(self, mb: dict, facts: list, n_pad: int, source) -> None:
        """A micro-batch handed to the consumer: ``facts``, the ``RowFacts`` of its rows of data (``row_facts``, made
        where the rows were produced; ``n_pad`` padding rows follow them); ``source``: the ``WorkSource`` their
        stream positions come from. A few additions: the consumer's ``next()`` pays for nothing else here."""
        n_real = len(facts)
        ids = mb.get("input_ids")
        width = ids.shape[-1] if isinstance(ids, np.ndarray) and ids.ndim == 2 else 0
        tokens = sum(f.tokens for f in facts)  # counted per row as it was made (RowFacts)
        # rows stacked to one width have width slots each; rows left at their own lengths (Tokenize without Pack:
        # a list of arrays) have no padding
        slots = n_real * width if width else tokens
        with self._lock:
            for f in facts:
                for d, first, k in f.single:
                    self.samples[d] += first
                    self.tokens[d] += k
                if f.packed is not None:
                    if self._packed_source is not source:
                        self._count_packed()
                    self._packed_source = source
                    self._packed.extend(f.packed)
            if len(self._packed.positions) >= PACKED_BATCH:
                self._count_packed()
            self.micro_batches += 1
            self.rows += n_real
            self.padding_rows += n_pad
            self.row_tokens += tokens
            self.row_slots += slots

    def _count_packed(self) -> None:
        """Add the pieces of packed rows gathered so far to the per-dataset counts: one mixture lookup and two
        bincounts for all of them (per micro-batch, those were most of the consumer's cost). Holding ``_lock``."""
        packed, self._packed = self._packed, _Packed()
        if not packed.positions:
            return
        n = len(self.samples)
        ds = self._packed_source.dataset_ids(np.asarray(packed.positions, dtype=np.int64))
        firsts = (np.asarray(packed.pieces) == 0) & (np.asarray(packed.offsets) == 0)
        self.samples += np.bincount(ds, weights=firsts, minlength=n).astype(np.int64)
        self.tokens += np.bincount(ds, weights=np.concatenate(packed.tokens), minlength=n).astype(np.int64)

    def add_wait(self, seconds: float) -> None:
        with self._lock:
            self.wait_s += seconds

    def snapshot(self, *, names: list[str], target: list[float], workers: int, skipped: int, filtered: int) -> dict:
        """The metrics as plain data (see ``Loader.metrics``)."""
        with self._lock:
            self._count_packed()
            elapsed = max(time.perf_counter() - self.started, 1e-9)
            total_s, total_t = int(self.samples.sum()), int(self.tokens.sum())
            datasets = {name: {"samples": int(self.samples[d]), "tokens": int(self.tokens[d]),
                               # Python floats, not numpy's: plain data for any serializer (YAML, orjson...)
                               "sample_share": int(self.samples[d]) / total_s if total_s else 0.0,
                               "token_share": int(self.tokens[d]) / total_t if total_t else 0.0,
                               "target_share": target[d]}
                        for d, name in enumerate(names)}
            now = remote_stats()
            remote = {k: now[k] - self.remote0.get(k, 0) + self.remote_workers.get(k, 0) for k in REMOTE_KEYS}
            return {
                "elapsed_s": elapsed,
                "datasets": datasets,
                "rows": self.rows, "micro_batches": self.micro_batches, "padding_rows": self.padding_rows,
                "tokens": self.row_tokens,
                "padding_tokens": self.row_slots - self.row_tokens,
                "padding_fraction": 1 - self.row_tokens / self.row_slots if self.row_slots else 0.0,
                "skipped": skipped, "filtered": filtered,
                "stage_s": dict(self.stage_s),
                "consumer_wait_s": self.wait_s,
                "consumer_wait_fraction": self.wait_s / elapsed,
                "worker_utilization": self.worker_s / (elapsed * max(1, workers)),
                "units": self.units,
                "remote": remote,
            }


class _Packed:
    """The pieces of combined rows, as parallel lists: stream positions, piece numbers, offsets in their documents
    (0: from its first token), and per row an array of the pieces' tokens."""

    def __init__(self):
        self.positions, self.pieces, self.offsets, self.tokens = [], [], [], []

    def extend(self, other: _Packed) -> None:
        self.positions += other.positions
        self.pieces += other.pieces
        self.offsets += other.offsets
        self.tokens += other.tokens


def _pieces(row: dict, single: list, packed: _Packed) -> None:
    """The source pieces of one delivered row: ``(dataset, starts a document, tokens)`` appended to ``single`` for a
    row of one sample (its ``Src`` names the dataset), else its pieces to ``packed``. A piece starts a document when
    it is the document's first (``__piece__`` 0) and, in a concat row, starts at its first token (``DOC_OFFSETS``).
    Tokens: a packed row's ``cu_seqlens`` (inputs only), a single record's ``num_tokens``; none for rows without."""
    src = row.get(SRC)
    if src is None:
        return
    if not isinstance(src, list):  # one sample (or one piece of a document split by Tokenize)
        single.append((int(src[0]), int(not row.get(PIECE, 0)), int(row.get("num_tokens") or 0)))
        return
    members = row.get(GROUP_ROWS)
    if isinstance(members, list):  # a group batch: its member rows
        for r in members:
            _pieces(r, single, packed)
        return
    if not src:
        return
    cu, offsets = row.get("cu_seqlens"), row.get(DOC_OFFSETS)
    if cu is not None and len(cu) == len(src) + 1:
        cu = np.asarray(cu)
        packed.tokens.append(cu[1:] - cu[:-1])  # np.diff's checks cost more than the subtraction
    else:
        packed.tokens.append(np.full(len(src), int(row.get("num_tokens") or 0) if len(src) == 1 else 0))
    packed.positions += [ref[0] for ref in src]
    packed.pieces += [ref[1] for ref in src]
    packed.offsets += offsets if offsets is not None else [0] * len(src)


def mark_offsets(chain) -> None:
    """Ask the concat packers of ``chain`` (a ``LanePipeline``'s ``(operator, accumulator)`` pairs) to say where each
    piece of a row starts in its document (``DOC_OFFSETS``, what ``row_facts`` needs to count a document once);
    ``row_facts`` removes it from the rows, so micro-batches stay as they were."""
    for _, acc in chain:
        if hasattr(acc, "mark_offsets"):
            acc.mark_offsets = True


class RowFacts(NamedTuple):
    """What ``add_micro_batch`` counts of one row of data, read off it where it was produced (the dispatcher thread:
    the row is still in cache, and the consumer's ``next()`` only adds these up).

    tokens: its attention positions (``count_nonzero`` of its ``attention_mask`` array; without one, the size of its
        ``input_ids`` array; 0 without either).
    single: ``(dataset, starts a document, tokens)`` of a row of one sample (``_pieces``).
    packed: the pieces of a combined row (``_Packed``), or None."""
    tokens: int
    single: list
    packed: _Packed | None


def row_facts(row: dict) -> tuple[dict, RowFacts]:
    """``(row without DOC_OFFSETS, its RowFacts)`` (a copy of the row only when it has the key)."""
    mask, ids = row.get("attention_mask"), row.get("input_ids")
    if isinstance(mask, np.ndarray):  # masks are 0/1: count_nonzero skips sum's widening of uint8
        tokens = int(np.count_nonzero(mask))
    else:  # no mask (Tokenize without Pack): every token of the row is one
        tokens = int(ids.size) if isinstance(ids, np.ndarray) else 0
    single, packed = [], _Packed()
    _pieces(row, single, packed)
    if DOC_OFFSETS in row:
        row = {k: v for k, v in row.items() if k != DOC_OFFSETS}
    return row, RowFacts(tokens, single, packed if packed.positions else None)
