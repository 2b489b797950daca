"""A host loader worker's lanes: its part of a rank's lanes."""
from __future__ import annotations

from ..work import TopologyError


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
