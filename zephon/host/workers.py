"""A host loader worker's lanes (its part of a rank's lanes), its runner, its items in bundles, and its end with the
training process."""
from __future__ import annotations

import multiprocessing
import os
import threading
import time

from ..work import TopologyError

# How often a host worker process checks that the process that started it is alive (``exit_with_parent``).
PARENT_CHECK_S = 2.0
_watched_pid: int | None = None  # the process whose watch thread runs (a forked child starts its own)


def worker_lanes(lanes: list[int], num_workers: int, worker_id: int) -> list[int]:
    """The subset of a rank's ``lanes`` that loader worker ``worker_id`` of ``num_workers`` owns.

    Hosts such as ``torch.utils.data.DataLoader`` pull one item from each worker in turn. If every
    worker that owns lanes yields the same number of items per step, in lane order, that round robin
    reproduces the rank's own order (micro-batch ``j`` of every lane, then ``j + 1``). So only
    ``w`` = the largest divisor of ``len(lanes)`` that is ``<= num_workers`` workers get lanes, each
    ``lanes[worker_id::w]``; the others get ``[]`` (they end at once and the host skips them).
    ``num_workers`` 0 (the host's main process) counts as 1. Returns a list (possibly empty).
    Raises ``TopologyError`` for ``worker_id`` outside ``[0, max(num_workers, 1))``."""
    n = max(num_workers, 1)
    if not 0 <= worker_id < n:
        raise TopologyError(f"worker_id={worker_id} is outside [0, num_workers={n})")
    w = max(d for d in range(1, min(n, len(lanes)) + 1) if len(lanes) % d == 0) if lanes else 1
    return list(lanes[worker_id::w]) if worker_id < w else []


def bundled(items, lanes, starts: dict, positions: int):
    """One host worker's ``(meta, payload)`` items in lists of ``positions`` consecutive (step, micro-batch) positions.

    A host moves each list as one item: torch's DataLoader pays a fixed cost per item in the training process (most of
    its CPU per step at small steps), and with ``positions`` = its ``num_workers`` an item holds about one local
    micro-batch of data, what ``prefetch_factor`` counts in torch's own loaders.
    items: the worker's items, in its order (``RankSession.worker_items``: position, then lane). lanes: the worker's
    lanes, in rank order. starts: ``{lane: (step, micro)}``, the first position each lane owes (they differ after a
    mid-step restore). positions: >= 1. A position ends with the last item of the last lane due at it, or when an
    item of a later position arrives (a lane that ended); items without a position (a finite stream's
    ``dropped_rows``) stay where they are. The first position's items go one list each: where one lane's
    micro-batch is a host batch (Energon's), the first batch then waits for one lane, not for all of the worker's.
    The input is closed when this generator is."""
    latest = max(starts.values(), default=(0, 0))
    bundle, done, current, first = [], 0, None, None
    try:
        for meta, payload in items:
            pos = (meta["step"], meta["micro"]) if "step" in meta else None
            if pos is not None and first in (None, pos):
                first = pos
                yield [(meta, payload)]
                continue
            if pos is not None and current is not None and pos != current:
                done, current = done + 1, None  # the previous position ended without its last lane
            if done == positions:
                yield bundle
                bundle, done = [], 0
            bundle.append((meta, payload))
            if pos is None:
                continue
            current = pos
            last_lane = lanes[-1] if pos >= latest else [lane for lane in lanes if starts[lane] <= pos][-1]
            if meta["last"] and meta["lane"] == last_lane:
                done, current = done + 1, None
                if done == positions:
                    yield bundle
                    bundle, done = [], 0
        if bundle:
            yield bundle
    finally:
        close = getattr(items, "close", None)
        if close is not None:
            close()


# The core runner of a host worker's Loader when the adapter's user names none. One worker thread, so the core's
# dispatcher computes the next units (up to ``read_ahead_steps``) while the host process hands the last ones out:
# with ``inline`` a worker computes only inside ``next()`` and the host's prefetch is its only read-ahead (stall
# 43 % -> 19 % for zephon_torch at 8 lanes, docs/benchmarks.md). One thread: the host's workers are the parallelism.
HOST_WORKER_RUNNER = ("threads", 1)


def host_worker_runner(runner=None, workers=None) -> tuple:
    """The ``(runner, num_workers)`` a host worker's ``Loader`` runs with.

    runner: ``"inline"``, ``"threads"``, ``"processes"`` or a runner the core accepts; None: ``HOST_WORKER_RUNNER``.
    workers: the runner's worker count; None: ``HOST_WORKER_RUNNER``'s (1). Returns the pair; the ``Loader``
    validates it (ValueError)."""
    return (HOST_WORKER_RUNNER[0] if runner is None else runner,
            HOST_WORKER_RUNNER[1] if workers is None else workers)


def exit_with_parent() -> None:
    """In a host's worker process (a ``multiprocessing`` child): end it once the process that started it is gone.

    torch's DataLoader worker notices a dead parent only between items, then joins its queue's feeder thread, which
    blocks for ever when the pipe is full of items nobody reads any more (a core worker's items are pickled numpy
    micro-batches, larger than a pipe's buffer), so the worker outlives a killed training process with its memory.
    A daemon thread checks the parent every ``PARENT_CHECK_S`` seconds. Once per process; nothing in a process that
    no ``multiprocessing`` parent started."""
    global _watched_pid
    if multiprocessing.parent_process() is None or _watched_pid == os.getpid():
        return
    _watched_pid, parent = os.getpid(), os.getppid()

    def watch():
        while os.getppid() == parent:  # a process whose parent died is adopted by another
            time.sleep(PARENT_CHECK_S)
        os._exit(1)  # nothing is left to hand items to; the parent's resources are already gone

    threading.Thread(target=watch, name="zephon-parent-watch", daemon=True).start()
