"""Building micro-batches ahead of the consumer: a thread that runs the tail multiplexer while the loop trains.

A ``Loader`` on the ``threads`` or ``processes`` runner starts one ``Builder`` per iteration, beside its
``Dispatcher``. The builder thread runs the tail (``Tail.steps``: choosing the step, taking a lane's rows,
collating, the cursor after) holding the Loader's lock, one micro-batch at a time, and queues each with its
``Handed`` record; the consumer's ``next()`` only takes the next one and delivers it (``Tail.deliver``: one
store of the lane's precomputed cursor, the counts). So the consumer pays for a hand-over, not for building,
and the building happens while it trains.

Exactly once: a lane's cursor is what was delivered, never what was built. The builder builds a lane's next
micro-batch only once the consumer took that lane's previous one (``wait_taken``), and starts a step only once
every micro-batch of the last one was taken, so every cursor it reads is final; a micro-batch built and never
taken (the iteration ended, was restored or closed) was never delivered, and the next iteration rebuilds it from
the cursors. The queue holds at most one micro-batch per lane (one step). The order is the tail's, whatever the
timing.

The ``inline`` runner has no builder: it computes inside ``next()`` by definition (the debugging runner).
"""
from __future__ import annotations

import logging
import threading
from collections import deque

from .dispatch import join_stopped

log = logging.getLogger("zephon")

# How long a wait sleeps before it looks again whether the builder was stopped or its thread died (every hand-over
# notifies, so this only bounds how late a wait notices what it was not told).
IDLE_S = 1.0
_END = object()
_ALL = object()  # ``waiting_for``: every lane's micro-batch (a new step)


class _Stopped(Exception):
    """The builder was stopped while it waited for the consumer."""


class _Raised:
    """An exception of the tail, handed to the consumer in its place in the order."""

    def __init__(self, error: BaseException):
        self.error = error


class Builder:
    """The thread that builds one iteration's micro-batches ahead of the consumer.

    Args:
        items: the iteration's ``(micro-batch, Handed)`` generator (``Tail.steps``, filtered by ``sharing`` when
            ranks share a lane); the builder runs it holding ``lock`` and closes it when it stops.
        lock: the Loader's ``threading.Condition`` (over an ``RLock``): held while a micro-batch is built; the
            builder waits on it for the consumer to take a lane's micro-batch.
        poke: called after each micro-batch is built (its lane's delivered rows were freed: the dispatcher may
            work further ahead).
    The tail's errors (bad data, a dead worker, a superseded iteration) reach the consumer in their place in the
    order; the builder then ends. ``start()`` starts the thread."""

    def __init__(self, items, lock: threading.Condition, poke):
        self.items, self.lock, self.poke = items, lock, poke
        self.ready: deque = deque()
        self.handoff = threading.Condition(threading.Lock())
        self.untaken: set[int] = set()  # lanes with a micro-batch built and not yet taken
        self.waiting_for = None  # what the builder waits on ``lock`` for: a lane, ``_ALL`` or nothing (None)
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
                self.handoff.wait(IDLE_S)
            item = self.ready.popleft()
        if item is _END:
            return None
        if isinstance(item, _Raised):
            raise item.error
        return item

    def taken(self, lane: int) -> None:
        """Lane ``lane``'s micro-batch was delivered: the builder may build its next one (notified only when what
        it waits for is now there; one consumer takes, so the last lane of a step taken sees the set empty)."""
        self.untaken.discard(lane)
        waiting_for = self.waiting_for  # read after the discard: a builder that set it later sees the discard
        if waiting_for is not None and (waiting_for == lane or (waiting_for is _ALL and not self.untaken)):
            with self.lock:
                self.lock.notify_all()

    def is_stopped(self) -> bool:
        """Whether ``stop()`` was called (or the thread ended)."""
        return self.stopped

    def stop(self) -> None:
        """Stop the thread (idempotent); wait for it unless called from it. Micro-batches built and not taken are
        dropped (never delivered: the next iteration rebuilds them from the cursors)."""
        self.stopped = True
        with self.lock:
            self.lock.notify_all()
        join_stopped(self.thread, "the micro-batch builder thread", "the loader's lock")

    # -- the tail's side (the builder thread, holding ``lock``) ----------------------------------------------------
    def mark(self, lane: int) -> None:
        """A micro-batch of ``lane`` is about to be queued."""
        self.untaken.add(lane)

    def wait_taken(self, lane: int | None) -> None:
        """Wait until the consumer took ``lane``'s micro-batch (None: every lane's). Raises ``_Stopped`` when the
        builder is stopped meanwhile."""
        def pending():
            return lane in self.untaken if lane is not None else bool(self.untaken)

        while pending():
            if self.stopped:
                raise _Stopped
            self.waiting_for = _ALL if lane is None else lane  # before the second look: see ``taken``
            if pending():
                self.lock.wait(IDLE_S)
            self.waiting_for = None

    # -- the thread ------------------------------------------------------------------------------------------------
    def _run(self) -> None:
        try:
            while not self.stopped:
                with self.lock:
                    item = next(self.items, _END)
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
