"""Energon's state shapes around Zephon checkpoints.

A ``save_state_rank()`` is the rank's Zephon checkpoint plus ``epoch_offset`` (batches of the current
virtual / limited epoch already handed out, Energon's ``EpochizeDataset`` / ``LimitDataset`` offset).
``save_state_global`` gives a list of rank states; ``restore_state_global`` broadcasts one merged state
whose ``epoch_offsets`` keep each lane's offset (``{str(lane): offset}``). See docs/energon.md.
"""
from __future__ import annotations

from zephon.host import CheckpointError, merge_rank_states


def check_state(state) -> None:
    """Refuse what is not a Zephon state before it is parsed: an Energon pickle state, or a list holding one.

    Args:
        state: a rank state (dict), a list of rank states, or None (the initial state).
    Raises ``CheckpointError`` naming the type found."""
    for s in state if isinstance(state, (list, tuple)) else [state]:
        if s is not None and not isinstance(s, dict):
            raise CheckpointError(f"not a zephon_energon state: {type(s).__name__} (an Energon pickle state cannot "
                                  f"be restored; start from a Zephon save_state_rank())")


def epoch_offset(state, rank_lanes) -> int:
    """The position in the current virtual / limited epoch a restored rank continues from.

    Args:
        state: a rank state (its ``epoch_offset``), a merged state (``epoch_offsets``: the offset saved with
            this rank's first lane), or a list of rank states (the offset of the rank that held this rank's
            first lane; at the same world size, its own).
        rank_lanes: the restoring rank's lanes.
    Returns 0 when the state carries no offset."""
    first = rank_lanes[0] if rank_lanes else None
    if isinstance(state, dict):
        by_lane = state.get("epoch_offsets")
        if isinstance(by_lane, dict):
            return int(by_lane.get(str(first), 0))
        return int(state.get("epoch_offset", 0) or 0)
    if isinstance(state, (list, tuple)):
        for s in state:
            if isinstance(s, dict) and any(isinstance(e, dict) and e.get("lane") == first for e in s.get("lanes", ())):
                return epoch_offset(s, rank_lanes)
    return 0


def merged_state(states):
    """One state to broadcast for ``restore_state_global``: a list of rank states merged by the core
    (``zephon.host.merge_rank_states``) with each lane's epoch offset.

    Args:
        states: a list of rank states (None entries ignored), or one state (returned as is).
    Raises ``CheckpointError`` when no state is given, one is not a Zephon state, or states conflict."""
    if not isinstance(states, (list, tuple)):
        return states
    check_state(states)
    merged = merge_rank_states(states)
    states = [s for s in states if s is not None]
    if len(states) == 1:
        return merged
    offsets = {str(e["lane"]): epoch_offset(s, [e["lane"]]) for s in states for e in s["lanes"]}
    if any(offsets.values()):  # per lane, the epoch offset of the rank that saved it
        merged["epoch_offsets"] = offsets
    return merged
