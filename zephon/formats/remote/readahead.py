"""Read-ahead: objects the core will read soon, fetched into the cache in the background, a few at a time.

The engine tells a dataset which shards its next chunks read (``Dataset.prefetch``, in the core's sample
order, ``Dataset.read_ahead_chunks`` chunks ahead of each lane); a remote dataset hands each to a
``ReadAhead``: at most ``parallel`` downloads run at once, in the order hinted, each object once at a time
per process. A job never evicts (it skips an object that would need
room under ``cache_limit``) and never raises: the read that needs the object reports any error itself. What
is read ahead changes speed only, never what is read. See docs/remote.md ("Read-ahead").
"""
from __future__ import annotations

import os
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Callable, Hashable

from .cache import no_eviction

DEFAULT_PARALLEL = 4
DEFAULT_CHUNKS = 16  # the horizon: at 2 chunks a lane reached a shard before its download (~1 round trip) ended


class ReadAhead:
    """A per-process background downloader. parallel: downloads at once (0: read-ahead off). chunks: the
    horizon, chunks past a lane's current one whose shards are hinted (``Dataset.read_ahead_chunks``).
    Picklable (the pool is made again in each process). Raises ValueError for a negative or non-int setting."""

    def __init__(self, parallel: int = DEFAULT_PARALLEL, chunks: int = DEFAULT_CHUNKS):
        for name, v, what in (("read_ahead", parallel, "parallel downloads"),
                              ("read_ahead_chunks", chunks, "chunks hinted ahead of each lane")):
            if isinstance(v, bool) or not isinstance(v, int) or v < 0:
                raise ValueError(f"{name} must be an int >= 0 ({what}), got {v!r}")
        self.parallel, self.chunks = parallel, chunks
        self._pid, self._pool, self._queued, self._lock = None, None, set(), threading.Lock()

    def __getstate__(self):
        return {"parallel": self.parallel, "chunks": self.chunks}

    def __setstate__(self, state):
        self.__init__(state["parallel"], state.get("chunks", DEFAULT_CHUNKS))

    def submit(self, key: Hashable, job: Callable[[], object]) -> None:
        """Run ``job()`` in the background unless ``key`` is queued or running already."""
        if self.parallel <= 0:
            return
        with self._lock:
            if self._pid != os.getpid():
                self._pid, self._queued = os.getpid(), set()
                self._pool = ThreadPoolExecutor(self.parallel, thread_name_prefix="zephon-read-ahead")
            if key in self._queued:
                return
            self._queued.add(key)
        self._pool.submit(self._run, key, job)

    def _run(self, key, job) -> None:
        try:
            with no_eviction():
                job()
        except Exception:  # the read that needs this object reports the error itself
            pass
        finally:
            with self._lock:
                self._queued.discard(key)


def has_room(cache, need: int) -> bool:
    """Whether ``need`` more bytes fit in ``cache`` without evicting anything (always, without a limit)."""
    return cache.limit is None or cache.usage() + need <= cache.limit
