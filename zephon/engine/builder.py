"""Building micro-batches ahead of the consumer: a thread that runs the tail multiplexer while the loop trains.

A ``Loader`` on the ``threads`` or ``processes`` runner starts one ``Builder`` per iteration, beside its
``Dispatcher``. The builder thread runs the tail (``Tail.steps``: choosing the step, taking a lane's rows,
collating, the cursor after) holding the Loader's lock, one micro-batch at a time, and queues each with its
``Handed`` record; the consumer's ``next()`` only takes the next one and delivers it (``Tail.deliver``: one
store of the lane's precomputed cursor, the counts). So the consumer pays for a hand-over, not for building,
and the building happens while it trains.

Exactly once: a lane's cursor is what was delivered, never what was built. The builder builds a lane's next
micro-batch only once the consumer took that lane's previous one, and starts a step only once every micro-batch of
the last one was taken (the tail yields ``Await`` markers; the builder waits, without the lock, until the lanes'
cursors are the very tuples it built), so every cursor it reads is final; a micro-batch built and never taken (the
iteration ended, was restored or closed) was never delivered, and the next iteration rebuilds it from the cursors.
A finite pass's end that changes cursors (``Batch(drop_last=True)`` drops the incomplete last step) waits until
the consumer asks for more (``DEMAND``), as inside ``next()``. The queue holds at most one micro-batch per lane
(one step). The order is the tail's, whatever the timing. The consumer's part of a delivery is one store and,
when the builder waits, setting its wake: it never waits on the loader's lock.

The ``inline`` runner has no builder: it computes inside ``next()`` by definition (the debugging runner).
"""
from __future__ import annotations

import logging
import threading
from collections import deque
from typing import NamedTuple

from .wake import IDLE_S, Wake, join_stopped

log = logging.getLogger("zephon")

_END = object()


class Await(NamedTuple):
    """What the tail yields on the builder thread to wait, without the loader's lock, until the consumer took the
    micro-batch built for ``lane`` (None: every lane's, before a new step)."""
    lane: int | None


DEMAND = object()  # the tail waits until the consumer asks for a micro-batch none is built for (a pass's end)


class _Stopped(Exception):
    """The builder was stopped while it waited for the consumer."""


class _Raised:
    """An exception of the tail, handed to the consumer in its place in the order."""

    def __init__(self, error: BaseException):
        self.error = error


class Builder:
    """The thread that builds one iteration's micro-batches ahead of the consumer.

    Args:
        items: the iteration's generator of ``(micro-batch, Handed)`` (``Tail.steps``), with ``Await`` and
            ``DEMAND`` markers in between; the builder runs it holding ``lock`` and closes it when it stops.
        lock: the Loader's ``threading.Condition`` (over an ``RLock``): held while a micro-batch is built.
        poke: called after each micro-batch is built (its lane's delivered rows were freed: the dispatcher may
            work further ahead).
    The tail's errors (bad data, a dead worker, a superseded iteration) reach the consumer in their place in the
    order; the builder then ends. ``start()`` starts the thread."""

    def __init__(self, items, lock: threading.Condition, poke):
        self.items, self.lock, self.poke = items, lock, poke
        self.ready: deque = deque()
        self.handoff = threading.Condition(threading.Lock())
        self.built: dict = {}  # lane -> (its LanePipeline, its cursor once the last micro-batch built is delivered)
        self.wake = Wake()  # set by the consumer when the builder waits (``waiting``)
        self.waiting = False
        self.asked = False  # the consumer waits for a micro-batch none is built for
        self.stopped = False
        self.thread = threading.Thread(target=self._run, name="zephon-build", daemon=True)

    def start(self) -> None:
        """Start the thread (once the tail knows this builder: it marks and waits through it)."""
        self.thread.start()

    # -- the consumer's side ---------------------------------------------------------------------------------------
    def take(self):
        """The next ``(micro-batch, Handed)``; None when the iteration is exhausted. Raises what the tail raised in
        its place, or ``RuntimeError`` when the builder thread ended without saying why (stopped from another
        thread)."""
        with self.handoff:
            while not self.ready:
                if self.stopped or not self.thread.is_alive():
                    raise RuntimeError("the loader's micro-batch builder thread stopped while the consumer waited "
                                       "for a micro-batch (the loader was closed from another thread?)")
                self.asked = True
                self.taken()
                self.handoff.wait(IDLE_S)
            self.asked = False
            item = self.ready.popleft()
        if item is _END:
            return None
        if isinstance(item, _Raised):
            raise item.error
        return item

    def taken(self) -> None:
        """A lane's cursor was stored (a micro-batch delivered) or the consumer asks for more: wake a waiting
        builder. Never blocks on the loader's lock, so an interrupt right after a delivery finds it done."""
        if self.waiting:
            self.wake.set()

    def is_stopped(self) -> bool:
        """Whether ``stop()`` was called (or the thread ended)."""
        return self.stopped

    def stop(self, wait: bool = True) -> None:
        """Stop the thread (idempotent); ``wait``: for it to leave, unless called from it. Micro-batches built and
        not taken are dropped (never delivered: the next iteration rebuilds them from the cursors)."""
        self.stopped = True
        self.wake.set()
        # A builder waiting for rows (``Loader.ensure``) looks at ``is_stopped`` when notified, or within ``IDLE_S``:
        # notify only if the lock is free now, since a finalizer (wait=False) must never block.
        if self.lock.acquire(blocking=wait):
            try:
                self.lock.notify_all()
            finally:
                self.lock.release()
        if wait:
            join_stopped(self.thread, "the micro-batch builder thread", "the loader's lock")

    # -- the tail's side (the builder thread) ----------------------------------------------------------------------
    def mark(self, lane: int, st, after: tuple) -> None:
        """A micro-batch of ``lane`` (pipeline ``st``) is about to be queued; ``after``: the lane's cursor once it
        is delivered (``Tail.deliver`` stores that very tuple)."""
        self.built[lane] = (st, after)

    def pending(self, lane: int | None) -> bool:
        """Whether the micro-batch built last for ``lane`` (None: for any lane) is not delivered yet."""
        if lane is None:
            return any(st.cursor is not after for st, after in self.built.values())
        st, after = self.built.get(lane, (None, None))
        return st is not None and st.cursor is not after

    def _wait(self, done) -> None:
        """Wait, without the loader's lock, until ``done()``; raises ``_Stopped`` when stopped meanwhile."""
        while not done():
            if self.stopped:
                raise _Stopped
            self.waiting = True  # before the second look: the consumer sets ``wake`` after its delivery
            self.wake.clear()
            if not done():
                self.wake.wait(IDLE_S)
            self.waiting = False

    # -- the thread ------------------------------------------------------------------------------------------------
    def _run(self) -> None:
        try:
            while not self.stopped:
                with self.lock:
                    item = next(self.items, _END)
                if isinstance(item, Await):
                    self._wait(lambda lane=item.lane: not self.pending(lane))
                    continue
                if item is DEMAND:
                    self._wait(lambda: self.asked)
                    continue
                self._put(item)
                if item is _END:
                    return
                self.poke()
        except _Stopped:
            pass
        except BaseException as e:  # the tail's error (or a bug of ours): the consumer hears of it in order
            self._put(_Raised(e))
        finally:
            self.stopped = True
            with self.handoff:
                self.handoff.notify_all()
            try:
                with self.lock:
                    self.items.close()
            except BaseException as e:  # closing runs the tail's cleanup; a failure there must not pass silently
                log.warning("zephon: closing the micro-batch builder's iteration raised %r", e)

    def _put(self, item) -> None:
        with self.handoff:
            self.ready.append(item)
            self.handoff.notify()
