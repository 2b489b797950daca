"""Per-rank checkpoints and selective restore: each rank saves only its own lanes (no collective), and a rank
restoring at another dp degree reads only the saved entries that hold the lanes it now owns.

A rank entry is ``save_rank_state(...)``'s dict: the rank's ``Loader.checkpoint()`` (``state``) with the
topology it was saved at (``dp_degree``, ``dp_rank``, ``lane_assignment``). Hosts store entries their own way
(files, DCP keys, a dict) and hand ``load_rank_states`` a ``read_entry(old_rank)`` callable. A merged checkpoint
(``gather_checkpoint``, ``merge_rank_states``) stays an option for small jobs and ``zephon verify``; see
docs/distributed.md, "Per-rank checkpoints".
"""
from __future__ import annotations

from ..checkpoint import CheckpointError, merge_states
from ..work.lanes import check_topology, lane_share, lanes_for_rank

RANK_FORMAT = "zephon-rank-state/1"


def rank_entries_needed(saved_dp: int, new_dp: int, new_rank: int, canonical_replicas: int, *,
                        saved_assignment: str = "contiguous", new_assignment: str = "contiguous") -> list[int]:
    """The old ranks (ascending) whose entries hold the lanes rank ``new_rank`` of ``new_dp`` owns.

    saved_dp: dp degree the entries were saved at. new_dp / new_rank: the restoring topology.
    canonical_replicas: lanes. saved_assignment / new_assignment: ``"contiguous"`` or ``"interleaved"``.
    Contiguous on both sides: at most ``ceil(saved_dp / new_dp) + 1`` ranks (exactly ``saved_dp / new_dp``
    when it divides); interleaved on both sides: the same when one dp divides the other, else up to one per lane
    the new rank owns (lane ``l`` was on old rank ``l % saved_dp``). When ranks shared a lane at save time
    (``saved_dp`` a multiple of ``canonical_replicas``) the first of them is read: sharing ranks save identical
    entries at a step boundary. Arithmetic only, O(lanes per rank).
    Raises ``TopologyError`` naming the valid dp degrees (``check_topology``)
    for a dp degree that neither divides ``canonical_replicas`` nor is a multiple of it."""
    check_topology(canonical_replicas, saved_dp)
    lanes = lanes_for_rank(canonical_replicas, new_dp, new_rank, new_assignment)
    return sorted({_holder(lane, saved_dp, canonical_replicas, saved_assignment) for lane in lanes})


def _holder(lane: int, dp: int, canonical_replicas: int, assignment: str) -> int:
    """The first rank of ``dp`` whose entry holds ``lane``."""
    if dp > canonical_replicas:  # sharing: ranks [lane*shares, ...) (contiguous) or lane, lane+R, ... hold it
        return lane * (dp // canonical_replicas) if assignment == "contiguous" else lane
    per_rank = canonical_replicas // dp
    return lane // per_rank if assignment == "contiguous" else lane % dp


def save_rank_state(state: dict, dp_degree: int, dp_rank: int, lane_assignment: str = "contiguous") -> dict:
    """This rank's entry of a per-rank checkpoint: ``state`` (its ``Loader.checkpoint()`` or
    ``RankSession`` state, this rank's lanes only) with the topology it was saved at. JSON data, O(lanes per
    rank) bytes; no collective.

    state: a Zephon checkpoint dict (``format`` ``zephon-checkpoint/1``). dp_degree / dp_rank: this rank's
    topology. lane_assignment: the loader's. Raises ``CheckpointError`` for a state that is not a Zephon
    checkpoint, ``TopologyError`` for an impossible topology."""
    if not isinstance(state, dict) or "lanes" not in state:
        raise CheckpointError(f"save_rank_state: not a Zephon checkpoint ({type(state).__name__})")
    lane_share(state["canonical_replicas"], dp_degree, dp_rank, lane_assignment)  # validates the topology
    return {"format": RANK_FORMAT, "dp_degree": dp_degree, "dp_rank": dp_rank, "lane_assignment": lane_assignment,
            "state": state}


def load_rank_states(read_entry, saved_dp: int, new_dp: int, new_rank: int, canonical_replicas: int, *,
                     saved_assignment: str = "contiguous", new_assignment: str = "contiguous") -> dict:
    """The checkpoint rank ``new_rank`` of ``new_dp`` restores from, read from only the entries it needs.

    read_entry: ``read_entry(old_rank) -> dict``, the entry ``save_rank_state`` made on ``old_rank`` (from a
    file, a DCP key, a dict); called once per rank of ``rank_entries_needed``, never for another.
    saved_dp, new_dp, new_rank, canonical_replicas, saved_assignment, new_assignment: as
    ``rank_entries_needed``. Returns a Zephon checkpoint holding (at least) the lanes the new rank owns, for
    ``Loader.restore`` / ``RankSession(state=...)``. Raises ``CheckpointError`` naming the old rank whose entry
    is not a rank entry, was saved at another topology, lacks a lane it should hold, or conflicts."""
    old_ranks = rank_entries_needed(saved_dp, new_dp, new_rank, canonical_replicas,
                                    saved_assignment=saved_assignment, new_assignment=new_assignment)
    states = [_checked(read_entry(r), r, saved_dp, saved_assignment) for r in old_ranks]
    merged = merge_states(states, complete=False)
    have = {e["lane"] for e in merged["lanes"]}
    lacking = [lane for lane in lanes_for_rank(canonical_replicas, new_dp, new_rank, new_assignment)
               if lane not in have]
    if lacking:
        raise CheckpointError(f"rank {new_rank} of {new_dp} needs lanes {lacking[:8]} from the entries of old ranks "
                              f"{old_ranks} (saved at dp {saved_dp}), which do not hold them")
    return merged


def _checked(entry, old_rank: int, saved_dp: int, saved_assignment: str) -> dict:
    """``entry``'s state after checking it is ``old_rank``'s entry of a ``saved_dp`` save."""
    if not isinstance(entry, dict) or entry.get("format") != RANK_FORMAT:
        fmt = entry.get("format") if isinstance(entry, dict) else type(entry).__name__
        raise CheckpointError(f"old rank {old_rank}'s entry is not a Zephon rank state (format {fmt!r}, expected "
                              f"{RANK_FORMAT!r})")
    saved = (entry.get("dp_degree"), entry.get("dp_rank"), entry.get("lane_assignment"))
    if saved != (saved_dp, old_rank, saved_assignment):
        raise CheckpointError(f"old rank {old_rank}'s entry was saved as rank {saved[1]} of dp {saved[0]} "
                              f"({saved[2]}), expected rank {old_rank} of dp {saved_dp} ({saved_assignment})")
    return entry["state"]
