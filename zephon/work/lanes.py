"""Which lanes a data-parallel rank owns, and which share of a lane's rows when ranks share lanes.

Lanes, not ranks, own data: ``canonical_replicas`` is fixed for a run's lifetime, ``dp_degree`` may
change between runs as long as it divides ``canonical_replicas`` (each rank owns whole lanes) or is a
multiple of it (``dp_degree / canonical_replicas`` ranks share each lane, each taking a contiguous block of
the lane's rows of every step; see docs/distributed.md, "More ranks than lanes").
"""
from __future__ import annotations

from numbers import Integral


class TopologyError(ValueError):
    """A dp_degree / dp_rank / lane layout that cannot own the canonical lanes evenly."""


def check_replicas(canonical_replicas) -> None:
    """Raise ``TopologyError`` unless ``canonical_replicas`` (the number of lanes) is an int >= 1: checked before
    any size derived from it (the global batch size defaults to it times the micro-batch size)."""
    if isinstance(canonical_replicas, bool) or not isinstance(canonical_replicas, Integral) or canonical_replicas < 1:
        raise TopologyError(f"canonical_replicas (the number of lanes) must be an int >= 1, got "
                            f"{canonical_replicas!r}")


def check_topology(canonical_replicas: int, dp_degree: int, dp_rank: int = 0) -> None:
    """Raise ``TopologyError`` unless ``canonical_replicas >= 1`` (``check_replicas``), ``0 <= dp_rank < dp_degree``
    and ``dp_degree`` divides ``canonical_replicas`` or is a multiple of it (both counts of processes; every rank
    must own the same number of lanes, or the same share of one lane)."""
    check_replicas(canonical_replicas)
    if dp_degree < 1 or (canonical_replicas % dp_degree and dp_degree % canonical_replicas):
        divisors = [d for d in range(1, canonical_replicas + 1) if canonical_replicas % d == 0]
        raise TopologyError(
            f"dp_degree={dp_degree} does not divide canonical_replicas={canonical_replicas} and is not a multiple "
            f"of it; valid dp degrees are {divisors} or a multiple of {canonical_replicas} (ranks then share "
            f"lanes: docs/distributed.md)")
    if not 0 <= dp_rank < dp_degree:
        raise TopologyError(f"dp_rank={dp_rank} is outside [0, dp_degree={dp_degree})")


def lane_share(canonical_replicas: int, dp_degree: int, dp_rank: int,
               assignment: str = "contiguous") -> tuple[int, int]:
    """``(shares, index)``: how many ranks share each of this rank's lanes and which of them this rank is.

    ``shares`` is ``dp_degree // canonical_replicas`` when ``dp_degree`` is a multiple of it (more ranks than
    lanes), else 1 (``index`` 0). Rank ``r`` takes block ``index`` of the ``shares`` contiguous blocks of each
    step's rows of its lane: ``index = r % shares`` (``"contiguous"``: ranks ``[l*shares, (l+1)*shares)``
    share lane ``l``) or ``r // canonical_replicas`` (``"interleaved"``: ranks ``l, l + canonical_replicas,
    ...`` share lane ``l``). Raises ``TopologyError`` (see ``check_topology``)."""
    check_topology(canonical_replicas, dp_degree, dp_rank)
    if assignment not in ("contiguous", "interleaved"):
        raise TopologyError(f"lane assignment must be 'contiguous' or 'interleaved', got {assignment!r}")
    if dp_degree <= canonical_replicas:
        return 1, 0
    shares = dp_degree // canonical_replicas
    return shares, (dp_rank % shares if assignment == "contiguous" else dp_rank // canonical_replicas)


def lanes_for_rank(canonical_replicas: int, dp_degree: int, dp_rank: int,
                   assignment: str = "contiguous") -> list[int]:
    """The lane ids (ascending) owned by ``dp_rank``: ``canonical_replicas // dp_degree`` of them, or the
    one lane it shares with ``dp_degree // canonical_replicas - 1`` other ranks when ``dp_degree`` is a
    multiple of ``canonical_replicas`` (``lane_share`` says which rows are its).

    ``assignment``: ``"contiguous"`` (rank r owns lanes ``[r*L, (r+1)*L)``; sharing: lane ``r // shares``) or
    ``"interleaved"`` (lanes ``r, r+dp_degree, ...``; sharing: lane ``r % canonical_replicas``). Raises
    ``TopologyError`` (see ``check_topology``)."""
    shares, _ = lane_share(canonical_replicas, dp_degree, dp_rank, assignment)
    if shares > 1:
        return [dp_rank // shares if assignment == "contiguous" else dp_rank % canonical_replicas]
    per_rank = canonical_replicas // dp_degree
    if assignment == "contiguous":
        return list(range(dp_rank * per_rank, (dp_rank + 1) * per_rank))
    return list(range(dp_rank, canonical_replicas, dp_degree))


def check_share_rows(rows_per_lane_step: int, micro_batch_size: int, shares: int) -> int:
    """Rows of a lane's step each sharing rank takes: ``rows_per_lane_step / shares``, a whole number of
    micro-batches. Raises ``TopologyError`` naming the numbers otherwise.

    rows_per_lane_step: rows each lane gives per global step (``global_batch_size / canonical_replicas``).
    micro_batch_size: rows per micro-batch. shares: ranks per lane (``dp_degree / canonical_replicas``)."""
    if shares < 1 or rows_per_lane_step % (shares * micro_batch_size):
        raise TopologyError(
            f"{shares} ranks share each lane, but the {rows_per_lane_step} rows a lane gives per step "
            f"(global_batch_size / canonical_replicas) are not a multiple of {shares} x micro_batch_size="
            f"{micro_batch_size} = {shares * micro_batch_size}, so they cannot be split into equal blocks of whole "
            f"micro-batches; use a global_batch_size that is a multiple of dp_degree x micro_batch_size, a "
            f"smaller micro_batch_size, or a dp_degree <= canonical_replicas")
    return rows_per_lane_step // shares
