"""Handing out work to the runner's workers: a dispatcher thread that keeps them busy while the consumer is away.

A ``Loader`` on the ``threads`` or ``processes`` runner starts one ``Dispatcher`` per iteration. Each time a unit
finishes (a ``Future`` callback) or a micro-batch's rows are taken (by the builder thread, ``engine.builder``, or
inside ``next()``), the dispatcher thread wakes, releases the finished units of every lane in sequence order into
their accumulators (``LanePipeline.release``) and submits the next units, least-stocked lane first, while the runner
has free workers and a lane is below its read-ahead bound. The consumer (``Loader.ensure``: the builder, or
``next()``) only waits for rows. The accumulators (packing, shuffling) and the dispatch (computing chunks,
submitting units) run on the dispatcher thread outside the Loader's lock, since only that thread touches them; a
lane's new rows, sealed spans and end are published holding it, and the consumer holds it while it takes rows, so
it never waits for a lane's packing or a chunk's computation, only for its rows. Dispatch order never changes the
output (per-lane sequence numbers); it changes only when rows are ready.

Read-ahead bound (memory): a lane gets a new unit only while the rows it holds plus those its units in flight should
give are fewer than ``read_ahead_steps`` lane steps plus the rows of its next unit; so a lane holds at most about
``read_ahead_steps`` steps and two units (``unit_size`` pointers each) of rows, besides its accumulators' state.

The ``inline`` runner computes on the consumer's thread by definition (it is the debugging runner: every unit runs
inside ``next()``, where a debugger or a profiler sees it), so it has no dispatcher and stalls the loop by design:
``work_inline`` hands out its work from inside ``next()``.
"""
from __future__ import annotations

import logging
import threading
from contextlib import contextmanager, nullcontext

from .wake import IDLE_S, Wake, join_stopped

log = logging.getLogger("zephon")


def work_inline(lanes: dict, order: list[int], runner, priority: int, need: float, through: int) -> None:
    """Work from inside ``next()`` (the ``inline`` runner) until lane ``priority`` holds ``need`` rows or ended.

    lanes: lane -> ``LanePipeline``. order: the owned lanes in tail order. runner: the ``Runner``.
    priority: the lane the tail waits on. need: rows it must hold. through: rows of this iteration each other lane
    works toward (a step count times the rows per lane step). Raises the lanes' errors (``DataError``...)."""
    st = lanes[priority]
    while len(st.rows) < need and not st.finished:
        if st.error is not None:  # kept when another lane's work released it: its rows stop here
            raise st.error
        _fill(lanes, order, runner, priority, need, through)
        if len(st.rows) < need and not st.finished:
            _release_keeping_error(st, block=True)  # a failing unit's predecessors may still cover ``need``


def _fill(lanes: dict, order: list[int], runner, priority: int, need: float, through: int) -> None:
    """Dispatch the lane the tail waits on until its expected rows cover ``need``, then the next lanes in tail order
    until each expects ``through`` rows of this iteration (counted from the rows each delivered in it,
    ``cursor[3]``), while the runner has free workers (only unfinished units count). Finished units of every lane
    are absorbed first, so estimates are fresh. Arguments as ``work_inline``'s."""
    for s in lanes.values():
        _release_keeping_error(s, block=False)
    st = lanes[priority]
    if not st.pending and st.can_dispatch() and st.expected_rows() < need:
        st.dispatch(runner)
    busy = sum(s.running() for s in lanes.values())
    while busy < runner.capacity and st.can_dispatch() and st.expected_rows() < need:
        st.dispatch(runner)
        busy += 1
    i = order.index(priority)
    for lane in order[i + 1:] + order[:i]:
        s = lanes[lane]
        while (busy < runner.capacity and s.error is None and s.can_dispatch()
               and s.expected_rows() < through - s.cursor[3]):
            s.dispatch(runner)
            busy += 1
        if busy >= runner.capacity:
            break


def _release_keeping_error(st, block: bool, guard=nullcontext) -> None:
    """``st.release`` (with ``guard``, see ``LanePipeline.release``) for a lane whose rows may not be needed yet: its
    error (bad data, a dead worker) is kept in ``st.error``, set under ``guard``, and raised when the consumer needs
    that lane's rows past those made before it, so an error surfaces at the same place whatever the runner and its
    timing. ``_Stopped`` passes through."""
    if st.error is not None or st.finished:
        return
    try:
        st.release(block=block, guard=guard)
    except _Stopped:
        raise
    except Exception as e:
        with guard():
            st.error = e


class _Stopped(Exception):
    """The dispatcher was stopped while it waited for the loader's lock."""


class _Notifying:
    """A runner whose futures wake the dispatcher when they finish (what ``LanePipeline.dispatch`` submits to)."""

    def __init__(self, runner, wake: Wake):
        self.runner, self.stage, self.capacity = runner, getattr(runner, "stage", None), runner.capacity
        self._wake = wake

    def submit(self, ptrs):
        future = self.runner.submit(ptrs)
        future.add_done_callback(self._done)
        return future

    def _done(self, _future) -> None:
        self._wake.set()  # cheap and never blocks a worker on the loader's lock


class Dispatcher:
    """The thread that absorbs finished units and hands out the next ones for one iteration of a Loader.

    Args:
        lanes: lane -> ``LanePipeline`` of the iteration (the dispatcher holds no reference to the Loader, so an
            abandoned Loader is still collected).
        order: the owned lanes in tail order (ties in stock go to the earliest).
        runner: the ``Runner`` (``threads`` or ``processes``).
        lock: the Loader's ``threading.Condition`` (over an ``RLock``): held while what the consumer reads of a lane
            changes; notified when rows arrive.
        ahead_rows: the read-ahead bound in rows per lane (``read_ahead_steps`` x rows per lane step), to which the
            rows of a lane's next unit are added.
    Errors of a lane (bad data, a dead worker) are kept per lane and raised to the consumer by ``wait_rows`` when
    it needs that lane's rows past those buffered before the error (so an error surfaces at the same place
    whatever the timing); an error of the dispatcher itself is raised to the consumer at once."""

    def __init__(self, lanes: dict, order: list[int], runner, lock: threading.Condition, ahead_rows: int):
        self.lanes, self.order, self.lock, self.ahead_rows = lanes, order, lock, ahead_rows
        self.wake = Wake()
        self.runner = _Notifying(runner, self.wake)
        self.crashed: BaseException | None = None
        self.want: tuple[int, float] | None = None  # (lane, rows) the consumer waits for
        self.stopped = False
        self.thread = threading.Thread(target=self._run, name="zephon-dispatch", daemon=True)
        self.thread.start()

    # -- the consumer's side (called holding ``lock``) -----------------------------------------------------------
    def wait_rows(self, lane: int, n: float, cancelled=None) -> None:
        """Wait until ``lane`` holds ``n`` rows or has ended; raises the lane's error (or the dispatcher's) when
        the rows it holds do not cover ``n``, and ``RuntimeError`` when the dispatcher or (``cancelled()`` true,
        checked at each notification of ``lock``) the waiter was stopped meanwhile."""
        st = self.lanes[lane]
        while len(st.rows) < n and not st.finished:
            if self.crashed is not None:
                raise self.crashed
            if st.error is not None:
                raise st.error
            if self.stopped or not self.thread.is_alive():
                raise RuntimeError(f"lane {lane}: the loader's dispatcher thread stopped while the consumer waited "
                                   f"for {n} rows (the loader was closed from another thread?)")
            if cancelled is not None and cancelled():
                raise RuntimeError(f"lane {lane}: the micro-batch builder was stopped while it waited for {n} rows")
            self.want = (lane, n)
            self.wake.set()
            self.lock.wait(IDLE_S)
        self.want = None

    def poke(self) -> None:
        """Rows were taken (a micro-batch built): a lane may have fallen below its bound."""
        self.wake.set()

    def stop(self, wait: bool = True) -> None:
        """Stop the thread (idempotent); ``wait``: for it to leave, unless called from it. Units in flight are left
        to the runner."""
        self.stopped = True
        self.wake.set()
        if wait:
            join_stopped(self.thread, "the dispatcher thread", "the loader's lock or its wake event")

    # -- the thread ------------------------------------------------------------------------------------------------
    def _run(self) -> None:
        try:
            while not self.stopped:
                self.wake.wait(IDLE_S)
                self.wake.clear()
                # Neither holds the lock: the accumulators and the dispatch state are this thread's alone; what the
                # consumer reads (rows, sealed spans, ``finished``, errors) is published holding it (``_publish``).
                self._release()
                if not self.stopped:
                    self._dispatch()
        except _Stopped:
            pass
        except BaseException as e:  # a bug of ours: the consumer must hear of it, not wait forever
            self.crashed = e
            with self.lock:
                self.lock.notify_all()

    @contextmanager
    def _publish(self):
        """The loader's lock, held while a lane changes what the consumer reads; the consumer is notified after.
        Raises ``_Stopped`` when the dispatcher is stopped while it waits (whoever stops it may hold the lock)."""
        while not self.lock.acquire(timeout=0.05):
            if self.stopped:
                raise _Stopped
        try:
            yield
            self.lock.notify_all()
        finally:
            self.lock.release()

    def _release(self) -> None:
        """Absorb what finished, lane by lane in tail order; a lane's error is kept for the consumer."""
        for lane in self.order:
            if self.stopped:
                return
            _release_keeping_error(self.lanes[lane], block=False, guard=self._publish)

    def _dispatch(self) -> None:
        """Hand out work: the lane the consumer waits on first, then the neediest lanes. Without the lock: it reads
        of the consumer's state only ``want`` (one reference) and the lengths of row buffers (which only shrink
        meanwhile: a lane then gets its unit a wake-up later)."""
        busy = sum(s.running() for s in self.lanes.values())
        if self.want is not None:  # the lane the consumer waits on first, as far as it needs
            lane, need = self.want
            st = self.lanes[lane]
            if st.error is None:
                if not st.pending and st.can_dispatch() and st.expected_rows() < need:
                    st.dispatch(self.runner)  # even past capacity: the consumer waits on nothing else
                    busy += 1
                while busy < self.runner.capacity and st.can_dispatch() and st.expected_rows() < need:
                    st.dispatch(self.runner)
                    busy += 1
        while busy < self.runner.capacity:
            st = self._neediest()
            if st is None:
                break
            st.dispatch(self.runner)
            busy += 1

    def _neediest(self):
        """The lane with the fewest expected rows among those below their read-ahead bound (the first in tail order
        on ties), or None."""
        best, best_rows = None, None
        for lane in self.order:
            st = self.lanes[lane]
            if st.error is not None or not st.can_dispatch():
                continue
            rows = st.expected_rows()
            if rows < self.ahead_rows + _unit_rows(st) and (best is None or rows < best_rows):
                best, best_rows = st, rows
        return best


def _unit_rows(st) -> float:
    """Rows the next unit of lane pipeline ``st`` should give (0 before the lane produced a row)."""
    if not st.total_produced:
        return 0.0
    return st.next_unit * st.total_produced / st.pointers_released
