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
