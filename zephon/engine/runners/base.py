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

    def close(self, wait: bool = True) -> None:
        """Stop the runner's workers; ``wait``: until they have stopped (False from a finalizer)."""


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

    def close(self, wait: bool = True) -> None:
        # A finalizer (wait=False) runs on whatever thread collected the loader, maybe inside a work function
        # holding a lock that this pool's worker waits for: waiting there could deadlock; the workers end anyway
        # once their unit is done. Neither can one of the pool's own threads wait for itself.
        mine = threading.current_thread() in getattr(self._pool, "_threads", ())
        self._pool.shutdown(wait=wait and not mine, cancel_futures=True)
