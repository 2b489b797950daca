"""Where work functions run: ``inline``, ``threads`` or ``processes``. A pure performance knob:
results are released by sequence number, so the runner never changes the output."""
from __future__ import annotations

import multiprocessing as mp
import os
from concurrent.futures import Future, ProcessPoolExecutor, ThreadPoolExecutor

RUNNERS = ("inline", "threads", "processes")

_worker_stage = None


def _init_worker(stage):
    global _worker_stage
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")  # one process per core already
    _worker_stage = stage


def _run_in_worker(ptrs):
    return _worker_stage.run(ptrs)


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
        self._pool.shutdown(wait=True, cancel_futures=True)


class ProcessRunner(Runner):
    """A pool of spawned processes, each given the stage once at start. Units travel as numpy arrays,
    results as records (multiprocessing's own transport). Operators' functions must be picklable."""

    name = "processes"

    def __init__(self, stage, num_workers: int = 2):
        super().__init__(stage, max(1, num_workers))
        self.capacity = 2 * self.num_workers
        self._pool = ProcessPoolExecutor(self.num_workers, mp_context=mp.get_context("spawn"),
                                         initializer=_init_worker, initargs=(stage,))

    def submit(self, ptrs) -> Future:
        return self._pool.submit(_run_in_worker, ptrs)

    def close(self) -> None:
        self._pool.shutdown(wait=True, cancel_futures=True)


def make_runner(name: str, stage, num_workers: int = 2) -> Runner:
    """Build a runner by name (``inline``, ``threads``, ``processes``; ``num_workers >= 1`` for the
    last two). Raises ``ValueError`` otherwise."""
    if name in ("threads", "processes") and (not isinstance(num_workers, int) or num_workers < 1):
        raise ValueError(f"num_workers must be an int >= 1 for the {name} runner, got {num_workers!r}")
    if name == "inline":
        return InlineRunner(stage)
    if name == "threads":
        return ThreadRunner(stage, num_workers)
    if name == "processes":
        return ProcessRunner(stage, num_workers)
    raise ValueError(f"runner must be one of {RUNNERS}, got {name!r}")
