"""Waking and stopping the loader's own threads (the dispatcher, ``engine.dispatch``; the builder, ``engine.builder``).

Both wait on a ``Wake`` between pieces of work and are stopped the same way: a flag, their wake set, then
``join_stopped``. Kept apart from either so that neither thread's module owns what both use.
"""
from __future__ import annotations

import logging
import queue
import threading

log = logging.getLogger("zephon")

# How long a waiting thread (the dispatcher, the builder, a consumer waiting for either) sleeps before it looks again
# whether it was stopped or the other side died: every finished unit, hand-over and stop wakes it, so this only bounds
# how late it notices what it was not told.
IDLE_S = 1.0
# How long close() waits for the dispatcher or the builder thread to leave (the dispatcher finishes the unit it is
# absorbing or the chunk it is computing, the builder the micro-batch it builds, then checks; neither waits on the
# lock past a stop).
JOIN_S = 60.0


class Wake:
    """``threading.Event``'s ``set`` / ``clear`` / ``wait``, for one waiting thread, with no lock in Python code:
    ``set`` is a flag and a ``queue.SimpleQueue.put`` (C code, reentrant). An abandoned loader's finalizer stops
    its threads by setting their wakes, and the garbage collector may run it on a thread already inside ``set`` or
    ``wait`` of that very wake (``Event``'s plain lock deadlocked there); a Ctrl-C may land anywhere in ``set``
    (``Condition``'s Python code could be left holding its lock, and the waiting thread then never woke)."""

    def __init__(self):
        self._tokens: queue.SimpleQueue = queue.SimpleQueue()
        self._flag = False

    def set(self) -> None:
        if not self._flag:
            self._flag = True
            self._tokens.put(None)

    def clear(self) -> None:
        self._flag = False
        while True:  # a token left by an earlier set() would end the next wait at once
            try:
                self._tokens.get_nowait()
            except queue.Empty:
                return

    def wait(self, timeout: float) -> bool:
        """Wait until set or ``timeout`` seconds passed; returns whether it is set."""
        if not self._flag:
            try:
                self._tokens.get(timeout=timeout)
            except queue.Empty:
                pass
        return self._flag


def join_stopped(thread: threading.Thread, what: str, waits_on: str) -> None:
    """Wait up to ``JOIN_S`` for a stopped ``thread`` to leave, unless called from it or never started; a warning
    names ``what`` and what it ``waits_on`` when it does not leave (a daemon thread, it exits with the process)."""
    if threading.current_thread() is thread or thread.ident is None:  # an interrupt can land inside Thread.start
        return
    thread.join(JOIN_S)
    if thread.is_alive():
        log.warning("zephon: %s did not stop within %s s (it waits on %s); it is a daemon thread and exits with the "
                    "process", what, JOIN_S, waits_on)
