"""The runner contract and the two in-process runners (``inline``, ``threads``)."""
from __future__ import annotations

import threading
from concurrent.futures import Future, ThreadPoolExecutor


class Runner:
    """``submit(ptrs) -> Future[UnitResult]``; ``capacity``: units worth keeping in flight;
    ``close()`` stops the workers. One runner may serve several loaders with the same stage."""

    name = "runner"
    capacity = 1

    def __init__(self, stage, num_workers: int = 0):
        self.stage = stage
        self.num_workers = num_workers

    def submit(self, ptrs) -> Future:
        raise NotImplementedError

    def close(self) -> None:
        pass


class InlineRunner(Runner):
    """Runs each unit in the caller's thread at submit time."""

    name = "inline"

    def submit(self, ptrs) -> Future:
        f: Future = Future()
        f.set_result(self.stage.run(ptrs))
        return f


class ThreadRunner(Runner):
    """A thread pool. Good when work releases the GIL (tokenizers' Rust code, pyarrow I/O) or on
    free-threaded Python."""

    name = "threads"

    def __init__(self, stage, num_workers: int = 2):
        super().__init__(stage, max(1, num_workers))
        self.capacity = 2 * self.num_workers
        self._pool = ThreadPoolExecutor(self.num_workers, thread_name_prefix="zephon-worker")

    def submit(self, ptrs) -> Future:
        return self._pool.submit(self.stage.run, ptrs)

    def close(self) -> None:
        # A finalizer may run this on one of the pool's own threads (a garbage collection there): it cannot
        # wait for itself, and its unit finishes anyway.
        mine = threading.current_thread() in getattr(self._pool, "_threads", ())
        self._pool.shutdown(wait=not mine, cancel_futures=True)
