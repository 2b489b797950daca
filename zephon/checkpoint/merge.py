"""Merging rank checkpoints: each rank's lanes into one global checkpoint, restorable at any dp_degree."""
from __future__ import annotations

from .schema import CheckpointError, lane_ranges, make_state, validate


def merge_states(states, *, complete: bool = True) -> dict:
    """Merge per-rank checkpoints into one global checkpoint that any dp_degree can restore.

    ``states``: iterable of checkpoint dicts (each with a subset of the lanes). Raises
    ``CheckpointError`` if fingerprints differ, a lane appears twice with different content, or (with
    ``complete``, the default) any of the ``canonical_replicas`` lanes is missing (named). ``complete=False``
    merges what is there (e.g. the rank states one rank could read); restoring it then names the lanes a
    loader needs and it lacks."""
    states = list(states)
    if not states:
        raise CheckpointError("no rank states to merge")
    first = states[0]
    for s in states:
        validate(s, first.get("fingerprint"), first.get("config", {}))
    merged: dict[int, dict] = {}
    for s in states:
        for e in s["lanes"]:
            if e["lane"] in merged and merged[e["lane"]] != e:
                raise CheckpointError(f"lane {e['lane']} is in two rank states with different content")
            merged[e["lane"]] = e
    r = first["canonical_replicas"]
    missing = sorted(set(range(r)) - set(merged))
    if missing and complete:
        raise CheckpointError(f"merged checkpoint lacks lanes {lane_ranges(missing)} of {r}: a rank's state is missing")
    return make_state(first["fingerprint"], first["config"], r, first["rows_per_lane_step"], list(merged.values()))
