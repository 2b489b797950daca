"""One lane's serial side: dispatch order, sequence reordering, accumulators, flush sentinels, the
row buffer and the replay cursor. Dispatch and release run on one thread (the dispatcher's, or the consumer's for
``inline``); the consumer takes rows and reads the cursor (``release``'s guard says what they share).

A flush span is the stretch between two flush sentinels: a sentinel follows every ``span`` pointers of
the lane (``flush_every_k_chunks * chunk_size``, possibly a fraction of a chunk), and every accumulator
flushes and resets when it passes, except one that carries (packing's open bins): it names the records it
keeps (``(position, piece)``, in the checkpoint entry's ``carry``). So the rows of span ``s`` are a pure
function of the lane's pointers ``[s*span, (s+1)*span)`` and the records carried into it; a resume
regenerates the carried records from their positions, then the span from ``(lane, chunk_id)``, and drops
the rows already delivered.
"""
from __future__ import annotations

from collections import deque
from contextlib import nullcontext
from time import perf_counter
from itertools import islice

import numpy as np

from ..checkpoint import LaneCursor
from ..formats import DataError
from ..formats.records import piece_ref
from ..ops.base import RecordError
from .carry import Carried, carrier_indexes, record_ref, ref_key, ref_record
from .metrics import mark_offsets, row_facts
from .stage import error_for

SENTINEL = "sentinel"
END = "end"


class LanePipeline:
    """One lane's pipeline on the pump: dispatch, sequence reorder, accumulators, row buffer, lane cursor.

    ``chain``: operators after the worker stage, in order (accumulators get one instance per lane;
    stateless ones run inline here). ``start``: the lane's ``LaneCursor`` (a checkpoint's) or None (fresh).
    ``ledger``: the loader's ``stage.SkipLedger`` (per-dataset skip limits) or None. ``dry_limit``: pointers the
    lane may release without producing a row before that is an error (None: no limit; see ``Loader``).
    ``skipped``: ``(start, stop)`` ranges of the lane's stream rows not to deliver (skipped steps); they count in
    the replay cursor and in ``LaneCursor.skipped_rows``, not in ``delivered_rows``. ``metrics``: the loader's
    ``metrics.MetricsCounter`` or None."""

    def __init__(self, lane: int, source, chain_ops, datasets, *, span: int, unit_size: int,
                 start: LaneCursor | None = None, ledger=None, dry_limit: int | None = None, skipped=(),
                 metrics=None, first_unit: int | None = None):
        self.lane = lane
        self.source = source
        self.datasets = datasets
        self.span = span
        self.cs = source.chunk_size
        self.unit_size = unit_size
        self.chain = [(op, op.new_accumulator(lane) if op.stateful else None) for op in chain_ops]
        if metrics is not None:  # before any row is made: concat rows say where their pieces start (row_facts)
            mark_offsets(self.chain)
        self.carriers = carrier_indexes(chain_ops)
        start = start or LaneCursor.fresh(lane)
        # Work sized to demand (never changes the output): the first unit is one step's rows (``first_unit``) plus
        # those a restore regenerates (``replay_cursor``), each next one twice the last, up to ``unit_size``.
        self.next_unit = max(1, min(unit_size, (first_unit or unit_size) + start.replay_cursor))
        first = start.first_pointer(self.cs)  # lane-local pointer index
        if first % span:
            raise ValueError(f"lane {lane}: sentinel at pointer {first} is not a multiple of the flush span {span}")
        self.span_index = first // span                              # span being produced
        # (span of the next row to deliver, rows of that span delivered, rows delivered in all (padding included),
        # buffered rows taken by this pipeline, stream rows skipped): one tuple, so a delivery commits with a single
        # attribute store that no signal can split (see ``cursor_after``); ``drop`` then frees the taken rows.
        self.cursor = (self.span_index, start.replay_cursor, start.delivered_rows, 0, start.skipped_rows)
        self.queued = 0  # rows ever put in the buffer (``rows``)
        self.skipped_ranges = list(skipped)
        self.stream_row, self.skipped_rows = start.stream_rows, start.skipped_rows  # of the next row produced
        self.replay_span, self.replay_skip = self.span_index, start.replay_cursor
        self.replayed_rows = 0
        self.produced = 0        # rows produced in this span so far
        self.sealed_rows = {}    # span -> final row count, once its sentinel passed
        self.carried = {}        # span -> {chain index (str): bins of record refs} carried into it
        if start.carry:
            self.carried[self.span_index] = start.carry
        self._resume_carry = start.carry or None  # regenerate before the span's first unit
        # rows ready for the tail: (span, row, index among the rows ever queued, index in its span plus one, stream
        # rows skipped before it, its metrics.RowFacts or None without metrics)
        self.rows: deque = deque()
        # dispatch side
        self.next_chunk, self.start_offset = divmod(first, self.cs)
        self._ahead: dict = {}   # chunk id -> pointers computed ahead for read-ahead hints
        self._hinted = 0         # chunks below this one were hinted
        # chunks past the current one whose shards are hinted: the longest horizon any dataset asks for
        self.horizon = max((getattr(d, "read_ahead_chunks", 0) for d in datasets), default=0)
        self.cur = None          # ChunkPointers being cut into units
        self.cur_offset = 0
        self.source_done = False
        self.seq_dispatch = 0
        self.seq_release = 0
        self.pending: dict[int, object] = {}  # seq -> Future | SENTINEL | END
        self.finished = False    # END released: no more rows will come
        self.error = None        # what release raised (bad data, a dead worker): raised where the rows stop
        self.unit_pointers: dict[int, int] = {}  # seq -> pointers of a unit in flight
        self.pointers_released = 0  # for the rows-per-pointer estimate that paces dispatch
        self.total_produced = 0
        # stats
        self.skipped = 0
        self.skipped_messages: list[str] = []
        self.filtered = 0
        self.ledger, self.dry_limit, self.metrics = ledger, dry_limit, metrics
        self.dry = 0  # pointers released since this lane last produced a row

    # -- dispatch ---------------------------------------------------------------------------
    def inflight(self) -> int:
        return sum(1 for p in self.pending.values() if p not in (SENTINEL, END) and not isinstance(p, Carried))

    def running(self) -> int:
        """Units submitted and not finished yet (what occupies workers)."""
        return sum(1 for p in self.pending.values() if p not in (SENTINEL, END) and not p.done())

    def expected_rows(self) -> float:
        """Rows buffered plus those the pointers in flight should yield (from this lane's rows per pointer so
        far: units differ in size; unknown until the lane produced a row, so then one unit in flight counts as
        enough)."""
        inflight = sum(self.unit_pointers.values())
        if not self.total_produced:  # no rate yet (an accumulator such as Pack may hold many records before its
            return float("inf") if inflight else len(self.rows)  # first row): one unit at a time, each twice the last
        return len(self.rows) + inflight * self.total_produced / self.pointers_released

    def can_dispatch(self) -> bool:
        return not self.source_done

    def dispatch(self, runner) -> None:
        """Submit the next unit of work (and any sentinel/end marker that follows it)."""
        if self._resume_carry is not None:  # first the records carried into the resumed span
            refs = {ref_key(r) for bins in self._resume_carry.values() for b in bins for r in b}
            positions = np.array(sorted({p for p, _ in refs}), dtype=np.int64)
            self._enqueue(Carried(runner.submit(self.source.pointers(self.lane, -1, positions))))
            self._resume_carry = None
        if self.cur is None:
            n = self.source.num_chunks(self.lane)
            if n is not None and self.next_chunk >= n:
                self._enqueue(END)
                self.source_done = True
                return
            self.cur = self._chunk_and_hint(runner, n)
            self.cur_offset, self.start_offset = self.start_offset, 0
        pos = self.next_chunk * self.cs + self.cur_offset  # lane-local index of the next pointer
        boundary = (pos // self.span + 1) * self.span       # next flush sentinel
        stop = max(self.cur_offset, min(len(self.cur), self.cur_offset + self.next_unit,
                                        self.cur_offset + boundary - pos))
        if stop > self.cur_offset:
            self.unit_pointers[self.seq_dispatch] = stop - self.cur_offset
            self._enqueue(runner.submit(self.cur.slice(self.cur_offset, stop)))
            self.next_unit = min(self.unit_size, 2 * self.next_unit)
        self.cur_offset = stop
        if self.next_chunk * self.cs + stop == boundary:
            self._enqueue(SENTINEL)
        if self.cur_offset >= len(self.cur):
            if len(self.cur) < self.cs:  # a finite stream's last, partial chunk
                self._enqueue(END)
                self.source_done = True
            self.cur = None
            self.next_chunk += 1

    def _chunk_and_hint(self, runner, n: int | None):
        """The pointers of chunk ``next_chunk``; first the shards of it and of the ``horizon`` chunks after it
        (``Dataset.read_ahead_chunks``) are hinted to the datasets (``WorkStage.hint``: read-ahead in the core's
        order). Chunks computed ahead are kept until used, so each is computed once."""
        stage = getattr(runner, "stage", None)
        last = self.next_chunk + self.horizon if n is None else min(self.next_chunk + self.horizon, n - 1)
        for c in range(max(self.next_chunk, self._hinted), last + 1):
            if stage is None:
                break
            try:
                ptrs = self.source.chunk(self.lane, c)
            except Exception:  # past the end of a stream of unknown length: nothing to hint
                break
            self._ahead[c] = ptrs
            stage.hint(ptrs)
            self._hinted = c + 1
        cur = self._ahead.pop(self.next_chunk, None)
        return cur if cur is not None else self.source.chunk(self.lane, self.next_chunk)

    def _enqueue(self, item) -> None:
        self.pending[self.seq_dispatch] = item
        self.seq_dispatch += 1

    # -- release (sequence reorder) ---------------------------------------------------------------
    def release(self, block: bool, guard=nullcontext) -> bool:
        """Release results in sequence order into the accumulators. With ``block``, wait for the next
        one. Returns whether anything was released. Raises ``DataError`` for bad data.

        guard: a callable giving the context in which what the consumer reads changes (the row buffer, sealed
        spans, carried records, ``finished``); the accumulators run outside it. The dispatcher passes the loader's
        lock, so the consumer never waits while a lane packs (only the dispatcher thread releases: everything else
        here is its own)."""
        released = False
        while self.seq_release in self.pending:
            item = self.pending[self.seq_release]
            rows = None
            if isinstance(item, Carried):
                if not item.done() and not (block and not released):
                    break
                self._resume(item.future.result())
            elif item not in (SENTINEL, END):
                if not item.done() and not (block and not released):
                    break
                rows = self._absorb(item.result())
                self.pointers_released += self.unit_pointers.pop(self.seq_release)
            del self.pending[self.seq_release]
            self.seq_release += 1
            released = True
            if item is SENTINEL or item is END:
                rows, carried = self._run_chain([], flush=True, carry=item is SENTINEL)
                with guard():
                    self._emit(rows)
                    self.sealed_rows[self.span_index] = self.produced
                    self.span_index += 1
                    self.produced = 0
                    if carried:
                        self.carried[self.span_index] = carried
                    self.finished = item is END
                if item is END:
                    self.pending.clear()
                    self.unit_pointers.clear()
                    break
            elif rows:
                with guard():
                    self._emit(rows)
        return released

    def _absorb(self, res) -> list:
        """A unit's result through the accumulators: its counts added, its rows returned (not yet emitted)."""
        if res.error is not None:
            raise res.error
        self.skipped += res.skipped
        room = 20 - len(self.skipped_messages)
        self.skipped_messages.extend(res.skipped_messages[:max(0, room)])
        self.filtered += res.filtered
        if self.ledger is not None:
            self.ledger.add(res)
        if self.metrics is not None:
            self.metrics.add_unit(res)
        self.dry += sum(res.seen.values())
        rows = self._push_chain(res.records)
        if not rows and self.dry_limit is not None and self.dry > self.dry_limit:
            raise DataError(f"lane {self.lane} produced no row from the last {self.dry} samples it read (more than "
                            f"a whole pass of the data, {self.dry_limit}): every sample is skipped ({self.skipped}) "
                            f"or filtered ({self.filtered}) on the way; first errors: "
                            f"{'; '.join(self.skipped_messages[:3]) or 'none'}. Check the filters, on_error and "
                            f"the field names")
        return rows

    def _push_chain(self, records: list) -> list:
        return self._run_chain(records, flush=False)[0]

    def _run_chain(self, records: list, flush: bool, carry: bool = False) -> tuple[list, dict]:
        """Push ``records`` through the pump-side operators; with ``flush``, each accumulator flushes
        after taking what the previous one emitted (a sentinel passing through, in order), or, with
        ``carry``, a carrying one keeps what it holds. Returns the rows and ``{chain index (str): bins of
        record refs}`` of what was carried."""
        carried = {}
        try:
            for i, (op, acc) in enumerate(self.chain):
                if acc is None:
                    before = len(records)
                    records = op.process_many(records)
                    if op.name == "filter":
                        self.filtered += before - len(records)
                    continue
                out, t = [], perf_counter()
                for r in records:
                    out.extend(acc.push(r))
                if flush and carry and i in self.carriers:
                    emitted, held = acc.carry()
                    out += emitted
                    if any(held):
                        carried[str(i)] = [[record_ref(r) for r in b] for b in held]
                elif flush:
                    out += acc.flush()
                if self.metrics is not None:
                    self.metrics.add_pump(op.name, perf_counter() - t)
                records = out
        except RecordError as e:
            raise error_for(self.datasets, e.src, str(e)) from None
        return records, carried

    def _resume(self, res) -> None:
        """Rebuild the carrying accumulators of a resumed span from the regenerated records (``res``, the
        worker stage's output for the carried positions), passed through the stateless operators before
        each of them."""
        if res.error is not None:
            raise res.error
        carry = self.carried[self.span_index]
        for key, bins in carry.items():
            i = int(key)
            records = res.records
            for op, acc in self.chain[:i]:
                if acc is None:
                    records = op.process_many(records)
            by_ref = {piece_ref(r): r for r in records}
            missing = [r for b in bins for r in b if ref_key(r) not in by_ref]
            if missing:
                raise RuntimeError(f"lane {self.lane}: the checkpoint carries records {missing[:5]} that their "
                                   f"positions no longer produce (the data changed under the same fingerprint?)")
            self.chain[i][1].resume([[ref_record(r, by_ref) for r in b] for b in bins])

    def _emit(self, rows: list) -> None:
        self.total_produced += len(rows)
        if rows:
            self.dry = 0
        for row in rows:
            self.produced += 1
            if self.span_index == self.replay_span and self.produced <= self.replay_skip:
                self.replayed_rows += 1  # delivered before the checkpoint: regenerate, don't repeat
                continue
            o = self.stream_row
            self.stream_row += 1
            if any(lo <= o < hi for lo, hi in self.skipped_ranges):
                self.skipped_rows += 1  # a skipped step's row: consumed, never delivered
                continue
            facts = None
            if self.metrics is not None:  # read off the row here, on the producing thread, not in next()
                row, facts = row_facts(row)
            self.rows.append((self.span_index, row, self.queued, self.produced, self.skipped_rows, facts))
            self.queued += 1

    # -- tail side ----------------------------------------------------------------------------
    def peek(self, n: int) -> list:
        """The next ``n`` rows (fewer at the end) without taking them: they count as delivered only once
        ``take`` commits them (after the consumer has the micro-batch built from them)."""
        return [r[1] for r in islice(self.rows, n)]

    def peek_facts(self, n: int) -> list:
        """The ``metrics.RowFacts`` of the rows ``peek(n)`` returns (None for each without metrics)."""
        return [r[5] for r in islice(self.rows, n)]

    @property
    def cursor_span(self) -> int:
        return self.cursor[0]

    @property
    def cursor_rows(self) -> int:
        return self.cursor[1]

    @property
    def delivered_rows(self) -> int:
        return self.cursor[2]

    def cursor_after(self, n: int, pad: int = 0) -> tuple[int, int, int, int, int]:
        """``cursor`` once the next ``n`` buffered rows (fewer at the end) and ``pad`` padding rows are
        delivered; nothing changes now. Committing is ``lane.cursor = that``, then ``drop()``."""
        s, r, total, taken, skipped = self.cursor
        for span, _, _, r, skipped, _ in islice(self.rows, n):
            s = span
            total += 1
            taken += 1
        return s, r, total + pad, taken, skipped

    def drop(self) -> None:
        """Free the buffered rows ``cursor`` counts as taken (idempotent; an interrupt here loses nothing:
        checkpoints read ``cursor`` only, and the next call finishes the job)."""
        taken = self.cursor[3]
        while self.rows and self.rows[0][2] < taken:
            self.rows.popleft()
        span = self.cursor[0]
        if min(self.sealed_rows, default=span) < span:
            self.sealed_rows = {k: v for k, v in self.sealed_rows.items() if k >= span}
        if min(self.carried, default=span) < span:
            self.carried = {k: v for k, v in self.carried.items() if k >= span}

    def take(self, n: int, pad: int = 0) -> list:
        """Pop up to ``n`` rows and advance the replay cursor: they count as delivered, with ``pad``
        padding rows of the same micro-batch."""
        out = self.peek(n)
        self.cursor = self.cursor_after(n, pad)
        self.drop()
        return out

    def lane_cursor(self, cursor: tuple | None = None) -> LaneCursor:
        """This lane's ``cursor`` (default: the current one) as a ``LaneCursor`` (what a checkpoint holds)."""
        s, r, total, _, skipped = self.cursor if cursor is None else cursor
        if self.sealed_rows.get(s) == r:  # that span is fully delivered: resume at the next one
            s, r = s + 1, 0
        return LaneCursor.at_span(self.lane, s, r, total, span=self.span, chunk_size=self.cs,
                                  carry=self.carried.get(s), skipped_rows=skipped)

    def state(self, cursor: tuple | None = None) -> dict:
        """``lane_cursor(cursor)`` as a checkpoint lane entry (plain JSON data, as a micro-batch carries it)."""
        return self.lane_cursor(cursor).to_dict()


