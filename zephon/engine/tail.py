"""The tail multiplexer: the owned lanes' rows -> micro-batches in step order, and what that decides.

It chooses the next step (lanes behind go first after a ragged checkpoint), pads a finite pass's last steps
(``Batch(drop_last=False)``), leaves them short (``short_last=True``: only real rows, a lane that ended gives
none) or drops and counts its incomplete tail (``drop_last=True``), builds each
micro-batch with its ``Handed`` record, which the consumer's side delivers (``deliver``) once it has the
micro-batch, and, when ranks share a lane, keeps this rank's block of each step (``sharing``). It runs on the
builder thread (``engine.builder``) or, with the inline runner and shared lanes, inside ``next()``. The lanes
themselves (their pipelines, dispatch and replay) are the ``Loader``'s. See docs/concepts.md ("tail multiplexer").
"""
from __future__ import annotations

import warnings
import weakref
from typing import NamedTuple

from .. import checkpoint as ckpt
from ..formats import DataError, DataWarning
from ..formats.records import LANE, MICRO, PAD, ROWS, STATE, STEP
from ..ops.batch import collate, padding_row
from .builder import DEMAND, Await
from .sharing import own_block


class Handed(NamedTuple):
    """What delivering a built micro-batch changes: its lane's ``LanePipeline``, the lane's cursor once the
    micro-batch is delivered (``LanePipeline.cursor_after``), its padding rows, and the ``RowFacts`` of its rows
    of data (None when it is another rank's block of a shared lane: not counted in this rank's metrics)."""
    lane: object
    after: tuple
    n_pad: int
    facts: list | None


class Tail:
    """One Loader's tail multiplexer (it lives as long as the Loader; counts survive its iterations).

    Args:
        loader: the ``Loader`` whose owned lanes (``lanes``, their ``LanePipeline``s) it multiplexes.
    Attributes: ``dropped_rows`` (rows of a finite pass's incomplete last step, with drop_last),
    ``padded_rows`` (padding rows delivered), ``builder`` (the current iteration's ``engine.builder.Builder``, or
    None when the tail runs inside ``next()``)."""

    def __init__(self, loader):
        # A proxy: the builder thread runs this tail, and a strong reference from a running thread would keep an
        # abandoned loader (and an iterator the user keeps in a reference cycle with it) from ever being collected,
        # so its iteration would never end and its threads would run until the process exits.
        self.loader = weakref.proxy(loader)
        self.builder = None
        self.template = None  # a delivered row: the shape of padding rows
        self.dropped_rows = 0
        self.padded_rows = 0
        self.steps_done = 0  # whole steps yielded by the current iteration (how far the lanes may work ahead)

    # -- delivery -------------------------------------------------------------------------------
    def deliver(self, mb: dict, handed: Handed | None) -> None:
        """Count micro-batch ``mb``, built with ``handed`` (None: delivered already, see ``sharing``), as
        delivered: the consumer has it. The delivery is one store of the lane's precomputed cursor, so an
        interrupt leaves it done or not done; the counts follow. Its rows are freed when the tail next reads
        the lane (``LanePipeline.drop``)."""
        if handed is None:
            return
        st = handed.lane
        if handed.facts is not None:
            self.loader._metrics.add_micro_batch(mb, handed.facts, handed.n_pad, st.source)
        st.cursor = handed.after  # the delivery
        self.padded_rows += handed.n_pad
        if self.builder is not None:
            self.builder.taken()

    def steps(self, generation: int):
        """``(micro-batch, Handed)`` of the owned lanes in step order until they end: within a step, micro-batch
        ``j`` of every ready lane in lane order, then ``j + 1``; each counts as delivered once ``deliver`` is
        called with it. ``generation``: the Loader's iteration this belongs to (a newer ``iter()`` or
        ``restore()`` makes this one raise ``RuntimeError``)."""
        plan = self.loader.plan
        # every lane fills every step (Batch(short_last=True): only real rows, the last steps short)
        pad = plan.finite and not plan.batch.drop_last and plan.pad_tail and not plan.batch.short_last
        self.steps_done = 0
        while True:
            yield from self._awaits(None)  # the cursors read to choose the step must be the delivered ones
            chosen = self._next_step(pad)
            if chosen is _DROP_REST:
                if self.builder is not None:
                    yield DEMAND  # the drop changes the cursors: only once the consumer asks for more
                self.drop_rest()
                chosen = None
            if chosen is None:
                self._check_delivered()
                return
            step, ready, offset = chosen
            for j in range(plan.rows_per_lane_step // plan.micro_batch_size):
                for lane in ready:
                    yield from self._micro_batch(lane, step, j, offset[lane], pad, generation)
            self.steps_done += 1

    def _next_step(self, pad: bool):
        """``(step, ready lanes, {lane: rows of the step already delivered})`` of the next step, None when the
        stream ends here, or ``_DROP_REST`` when it ends once its incomplete tail is dropped and counted
        (drop_last: ``steps`` calls ``drop_rest``)."""
        L, rps = self.loader, self.loader.plan.rows_per_lane_step
        self._free_delivered()
        drop_last = L.plan.batch.drop_last
        active = self._active(pad)
        if not active:
            return None
        if drop_last and len(active) < len(L.lanes):
            return _DROP_REST  # a lane of this rank has ended: no complete step can follow
        candidates = L.lanes if pad else active
        # Step order even after a ragged (mid-step, per-rank) checkpoint: lanes behind go first.
        cursors = {lane: L.lane(lane).lane_cursor() for lane in candidates}
        step = ckpt.first_step(cursors.values(), rps)
        offset, ready, short, owed = {}, [], False, False
        for lane in candidates:
            st = L.lane(lane)
            if cursors[lane].step(rps) != step:
                continue
            offset[lane] = cursors[lane].in_step(rps)  # non-zero only after a mid-step checkpoint
            if not L.plan.finite:  # an endless lane never ends: its rows are worked for as its micro-batch comes
                ready.append(lane)
                continue
            if pad:  # every lane fills the step; it is owed unless all ran out at its start: one live lane says no
                if not owed:
                    L.ensure(lane, 1)
                    owed = offset[lane] > 0 or not _spent(st)
                ready.append(lane)
                continue
            # drop_last must know the step is whole before it yields any of it; without, one row makes a lane ready
            L.ensure(lane, rps - offset[lane] if drop_last else 1)
            if len(st.rows) >= rps - offset[lane] or (st.rows and not drop_last):
                ready.append(lane)
            else:  # this lane ended inside the step (only matters with drop_last)
                short = True
        if short and drop_last:
            return _DROP_REST  # a finite stream's last, incomplete step: this rank stops here
        if pad and not owed:
            return None  # every lane ran out at a step boundary (a restore after the pass's end): nothing owed
        return step, ready, offset

    def _awaits(self, lane: int | None):
        """On the builder thread: an ``Await`` marker while the micro-batch built last for ``lane`` (None: any
        lane's) is not delivered; the builder resumes the tail once it is."""
        if self.builder is not None and self.builder.pending(lane):
            yield Await(lane)

    def _free_delivered(self) -> None:
        """Free the rows delivered (every cursor is final here), so the lanes' rows and cursors say what is
        left."""
        for lane in self.loader.lanes:
            self.loader.lane(lane).drop()

    def _check_delivered(self) -> None:
        """At the end of a finite pass: raise ``DataError`` when no owned lane ever delivered a row (restored counts
        included) although the lanes read samples, so every one was skipped or filtered on the way (a lane that
        yields nothing is an error, as in an endless stream; silence would end training with no data). Only where
        this loader owns the whole pass (dp_degree 1): one rank of several cannot tell, and one whose lanes are all
        filtered out pads the steps the others go on with (``host.StepAgreement``)."""
        sts = self.loader.lane_pipelines()
        if self.loader.plan.dp_degree > 1 or any(st.delivered_rows for st in sts):
            return
        skipped, filtered = sum(st.skipped for st in sts), sum(st.filtered for st in sts)
        if skipped or filtered:
            first = [m for st in sts for m in st.skipped_messages][:3]
            raise DataError(f"this finite pass delivered nothing on lanes {self.loader.lanes}: every sample they read "
                            f"was skipped ({skipped}) or filtered ({filtered}) on the way; first errors: "
                            f"{'; '.join(first) or 'none'}. Check the filters, on_error and the field names")

    def _active(self, pad: bool) -> list[int]:
        """Owned lanes with rows still to deliver (with padding: also a lane that ran out mid-step, which still
        owes that step's padding, after a restore there)."""
        L, rps = self.loader, self.loader.plan.rows_per_lane_step
        active = [lane for lane in L.lanes if not _spent(L.lane(lane))]
        if pad:
            active += [lane for lane in L.lanes if lane not in active and L.lane(lane).lane_cursor().in_step(rps)]
        return active

    def _micro_batch(self, lane: int, step: int, j: int, offset: int, pad: bool, generation: int):
        """Yield micro-batch ``j`` of ``lane``'s ``step`` (nothing when the lane delivered it before a
        mid-step checkpoint, or has no row and owes no padding)."""
        L, m = self.loader, self.loader.plan.micro_batch_size
        start = max(j * m, offset)
        if start >= (j + 1) * m:
            return
        L.check_generation(generation)
        # Rows count as delivered only once the consumer has their micro-batch (``deliver``): peek, build
        # everything, and hand it over with the lane's cursor after it. A lane's next micro-batch is built only
        # once its last one was delivered, so the cursor read here is final.
        yield from self._awaits(lane)
        st = L.lane(lane)
        st.drop()
        L.ensure(lane, (j + 1) * m - start)  # only this micro-batch's rows: the first one comes without the step's
        rows = st.peek((j + 1) * m - start)
        if rows and self.template is None:
            self.template = rows[0]
        n_real = len(rows)
        n_pad = (j + 1) * m - start - n_real if pad else 0
        if n_pad:
            rows += self.padding(n_pad)
        if not rows:
            return
        mb = collate(rows)
        mb[LANE], mb[STEP], mb[MICRO] = lane, step, j
        if n_pad:
            mb[PAD] = n_pad
        after = st.cursor_after(n_real, n_pad)  # the lane's cursor once mb is consumed
        if L.emit_state:
            mb[STATE] = st.state(after)
            mb[ROWS] = len(rows)
        lo, hi = own_block(L)
        # this rank's micro-batch (sharing a lane, the other blocks are the other ranks'): counted when delivered
        facts = st.peek_facts(n_real) if lo <= j < hi else None
        if self.builder is not None:
            self.builder.mark(lane, st, after)
        yield mb, Handed(st, after, n_pad, facts)

    # -- a finite pass's end --------------------------------------------------------------------
    def padding(self, n: int) -> list[dict]:
        """``n`` padding rows shaped like a delivered row (``ops.batch.padding_row``). Raises ``RuntimeError``
        when the loader has delivered no row to copy the shape from."""
        L = self.loader
        if self.template is None:
            for lane in L.lanes:  # a row to copy the shape from: the first lane that has one (a step asks one lane)
                L.ensure(lane, 1)
                if L.lane(lane).rows:
                    break
            buffered = [st.rows[0][1] for st in L.lane_pipelines() if st.rows]  # (span, row, ...)
            self.template = buffered[0] if buffered else empty_row(L.chain_ops)
        if self.template is None:
            raise RuntimeError(f"lanes {L.lanes} delivered no row in this pass (every sample filtered or "
                               f"skipped?), so the padding of its last steps (drop_last=False) has no row shape "
                               f"to copy; use fewer canonical_replicas")
        return [padding_row(self.template)] * n

    def drop_rest(self) -> None:
        """Count (never silently lose) every row left in the owned lanes of a finished stream. More than one
        step's rows dropped is said aloud (a warning); a pass that delivered no step at all is an error."""
        L, rps = self.loader, self.loader.plan.rows_per_lane_step
        empty = [lane for lane in L.lanes  # the lanes that cannot fill another step
                 if L.lane(lane).finished and len(L.lane(lane).rows) < rps]
        before, delivered = self.dropped_rows, sum(L.lane(lane).delivered_rows for lane in L.lanes)
        for lane in L.lanes:
            st = L.lane(lane)
            L.ensure(lane, float("inf"))
            self.dropped_rows += len(st.take(len(st.rows)))
        dropped = self.dropped_rows - before
        if not dropped:
            return
        why = (f"lanes {empty} of dp_rank {L.plan.dp_rank} ran out of rows, so with Batch(drop_last=True) no later "
               f"step is complete and the {dropped} rows left in its other lanes are dropped (loader.stats()"
               f"['dropped_rows'])")
        if delivered == 0:
            raise DataError(f"this finite pass delivered no step: {why}. Its samples are spread unevenly over the "
                            f"lanes (every sample of some lanes skipped or filtered?); use Batch(drop_last=False), "
                            f"which pads the last steps instead, or fewer canonical_replicas")
        if dropped > len(L.lanes) * rps:
            warnings.warn(f"finite pass: {why}; use Batch(drop_last=False) to deliver them (the last steps padded)",
                          DataWarning, stacklevel=2)


_DROP_REST = object()  # ``_next_step``: the stream ends here once the rows left are dropped (drop_last)


def empty_row(chain_ops):
    """A row of no document when the rows come out of ``Pack`` (only reordering operators after it in
    ``chain_ops``, the pump-side operators), whose shape needs no delivered row; else None."""
    for op in reversed(chain_ops):
        if op.name == "pack":
            return op.new_accumulator(0).flush_empty()
        if not op.reorders_only:
            return None
    return None


def _spent(st) -> bool:
    """A lane pipeline that ended and holds no row."""
    return st.finished and not st.rows
