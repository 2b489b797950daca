"""Which lanes a data-parallel rank owns.

Lanes, not ranks, own data: ``canonical_replicas`` is fixed for a run's lifetime, ``dp_degree`` may
change between runs as long as it divides ``canonical_replicas``.
"""
from __future__ import annotations


class TopologyError(ValueError):
    """A dp_degree / dp_rank / lane layout that cannot own the canonical lanes evenly."""


def check_topology(canonical_replicas: int, dp_degree: int, dp_rank: int = 0) -> None:
    """Raise ``TopologyError`` unless ``0 <= dp_rank < dp_degree`` and ``dp_degree`` divides
    ``canonical_replicas`` (both counts of processes; every rank must own the same number of lanes)."""
    if canonical_replicas < 1:
        raise TopologyError(f"canonical_replicas must be >= 1, got {canonical_replicas}")
    if dp_degree < 1 or canonical_replicas % dp_degree:
        divisors = [d for d in range(1, canonical_replicas + 1) if canonical_replicas % d == 0]
        raise TopologyError(
            f"dp_degree={dp_degree} does not divide canonical_replicas={canonical_replicas}; "
            f"valid dp degrees are {divisors}")
    if not 0 <= dp_rank < dp_degree:
        raise TopologyError(f"dp_rank={dp_rank} is outside [0, dp_degree={dp_degree})")


def lanes_for_rank(canonical_replicas: int, dp_degree: int, dp_rank: int,
                   assignment: str = "contiguous") -> list[int]:
    """The lane ids (ascending) owned by ``dp_rank``: ``canonical_replicas // dp_degree`` of them.

    ``assignment``: ``"contiguous"`` (rank r owns lanes ``[r*L, (r+1)*L)``) or ``"interleaved"``
    (lanes ``r, r+dp_degree, ...``). Raises ``TopologyError`` (see ``check_topology``)."""
    check_topology(canonical_replicas, dp_degree, dp_rank)
    per_rank = canonical_replicas // dp_degree
    if assignment == "contiguous":
        return list(range(dp_rank * per_rank, (dp_rank + 1) * per_rank))
    if assignment == "interleaved":
        return list(range(dp_rank, canonical_replicas, dp_degree))
    raise TopologyError(f"lane assignment must be 'contiguous' or 'interleaved', got {assignment!r}")


def split_lanes(lanes: list[int], num_workers: int, worker_id: int) -> list[int]:
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
