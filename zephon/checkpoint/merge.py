"""Merging rank checkpoints: each rank's lanes into one global checkpoint, restorable at any dp_degree."""
from __future__ import annotations

from .schema import CheckpointError, LaneCursor, lane_ranges, make_state, validate

#: The most steps the lanes of one save of an endless stream lie apart. A rank's lanes are within one micro-batch of
#: each other, and data-parallel ranks step together: one may have taken the next step's micro-batches (a host that
#: fetches a batch ahead) before the others finished theirs. Further apart, the states come from different saves.
MAX_STEP_SPREAD = 2


def merge_states(states, *, complete: bool = True, names=None) -> dict:
    """Merge per-rank checkpoints into one global checkpoint that any dp_degree can restore.

    ``states``: iterable of checkpoint dicts (each with a subset of the lanes), in rank order. A lane may be
    in several states (ranks that share it, ``dp_degree`` a multiple of ``canonical_replicas``) only with
    identical entries: sharing ranks checkpoint at a step boundary. Raises ``CheckpointError`` if
    fingerprints differ, a lane appears twice with different content (naming the lane, the two states'
    positions in ``states`` and where each one is), or (with
    ``complete``, the default) any of the ``canonical_replicas`` lanes is missing (named). ``complete=False``
    merges what is there (e.g. the rank states one rank could read); restoring it then names the lanes a
    loader needs and it lacks. ``names``: what the messages call each state (``check_step_spread``'s; default
    ``state i``). States of an endless stream more than ``MAX_STEP_SPREAD`` steps apart are refused."""
    states = list(states)
    if not states:
        raise CheckpointError("no rank states to merge")
    first = states[0]
    for s in states:
        validate(s, first.get("fingerprint"), first.get("config", {}))
    merged: dict[int, dict] = {}
    first_in: dict[int, int] = {}  # lane -> index of the first state holding it
    for i, s in enumerate(states):
        for e in s["lanes"]:
            lane = e["lane"]
            if lane in merged and merged[lane] != e:
                raise CheckpointError(_conflict(lane, first_in[lane], merged[lane], i, e, s["rows_per_lane_step"]))
            merged[lane] = e
            first_in.setdefault(lane, i)
    r = first["canonical_replicas"]
    # only a complete merge looks at every lane: a partial one (a rank's restore) stays O(lanes it holds)
    missing = sorted(set(range(r)) - set(merged)) if complete else []
    if missing:
        raise CheckpointError(f"merged checkpoint lacks lanes {lane_ranges(missing)} of {r}: a rank's state is missing")
    check_step_spread(states, names)
    return make_state(first["fingerprint"], first["config"], r, first["rows_per_lane_step"], list(merged.values()))


def merge_rank_states(states) -> dict:
    """One state from what a restore was given: a list of rank states merged (the lanes there are, as
    ``merge_states(complete=False)``: a restoring rank names the lanes it lacks), or one state as is.

    Args:
        states: a list or tuple of rank states (None entries ignored), or one state dict.
    Raises ``CheckpointError`` when the list holds no state, an entry is not a dict (naming its type), or the
    states do not merge."""
    if not isinstance(states, (list, tuple)):
        return states
    states = [s for s in states if s is not None]
    if not states:
        raise CheckpointError("no rank states given")
    for s in states:
        if not isinstance(s, dict):
            raise CheckpointError(f"not a Zephon rank state: {type(s).__name__}")
    return states[0] if len(states) == 1 else merge_states(states, complete=False)


def _conflict(lane: int, i: int, a: dict, k: int, b: dict, rows_per_lane_step: int) -> str:
    """The message for lane ``lane`` found in states ``i`` and ``k`` (positions in the list: ranks when the
    list is in rank order) with different entries ``a`` and ``b``."""
    def where(e):
        c = LaneCursor.from_dict(e)  # validated by merge_states
        step, row = c.step(rows_per_lane_step), c.in_step(rows_per_lane_step)
        return f"{c.delivered_rows} rows delivered (step {step}" + (f", row {row} of it)" if row else ")")
    hint = ("ranks that share a lane (dp_degree a multiple of canonical_replicas) must all checkpoint after the "
            "same step, at a step boundary (after the last micro-batch of the step); re-save after a whole step"
            if a.get("delivered_rows") != b.get("delivered_rows") else
            "they are at the same row but their cursors differ (states of two different runs?)")
    return (f"lane {lane} is in rank states {i} and {k} (positions in the list merged) with different content: "
            f"state {i} has {where(a)}, state {k} has {where(b)}; {hint}")


def check_step_spread(states, names=None) -> None:
    """Refuse rank states of an endless stream from different saves (a rank's file left from an earlier checkpoint,
    a rank that died while saving): their lanes lie more than ``MAX_STEP_SPREAD`` steps apart. A finite pass is not
    checked (a lane that ended stays behind the others).

    states: validated checkpoints of one config. names: what to call each in the message (default ``state i``,
    its position in the list). Raises ``CheckpointError`` naming the two furthest apart and their steps."""
    if len(states) < 2 or (states[0].get("config", {}).get("work") or {}).get("exhaustion") != "repeat":
        return
    names = names or [f"state {i}" for i in range(len(states))]
    spans = []  # (first step, last step, name) of each state holding lanes
    for s, name in zip(states, names):
        steps = [e["delivered_rows"] // s["rows_per_lane_step"] for e in s["lanes"]]
        if steps:
            spans.append((min(steps), max(steps), name))
    if not spans:
        return
    lo, hi = min(spans, key=lambda t: t[0]), max(spans, key=lambda t: t[1])
    if hi[1] - lo[0] > MAX_STEP_SPREAD:
        raise CheckpointError(f"rank states from different saves: {lo[2]} is at step {lo[0]} and {hi[2]} at step "
                              f"{hi[1]} ({hi[1] - lo[0]} steps apart; the ranks of one save of an endless stream are "
                              f"at most {MAX_STEP_SPREAD} apart). A rank's state was left from an earlier checkpoint, "
                              f"or a rank failed while saving: restore a save every rank completed")
