"""What a config change moves: the first global step whose batch differs, and the documents moved per dataset.

Both configs' steps are named by ``explain`` (no training run, no topology), then compared row by row. See
docs/debugging.md.
"""
from __future__ import annotations

from collections import Counter

from ..checkpoint.config_diff import config_diff
from .explain import explain
from .plan import dataset_names


def _placed(ex: dict) -> dict:
    """``{(dataset name, shard, sample, piece): (step, lane, micro, row)}`` of every document piece in ``ex``."""
    return {(p["dataset_name"], p["shard"], p["sample"], p["piece"]): (r["step"], r["lane"], r["micro"], r["row"])
            for r in ex["rows"] for p in r["pieces"]}


def _signature(ex: dict, step: int) -> list:
    """What step ``step`` of ``ex`` holds, row by row: each piece's document and token span."""
    return [[(p["dataset_name"], p["shard"], p["sample"], p["piece"], tuple(p["tokens"] or ())) for p in r["pieces"]]
            for r in ex["rows"] if r["step"] == step]


def compare_plans(old, new, steps: int, state=None) -> dict:
    """Compare the first ``steps`` global steps of two configs.

    old, new: ``LoaderPlan``s (e.g. a run's and its edited config; any dp). steps: how many steps from the start
    (or from ``state``'s step) to compare. state: a checkpoint of ``old``'s run to start both from (its cursors
    are used for ``old`` only; ``new`` replays from its start).
    Returns ``{"first_differing_step": step or None, "steps": [first, end], "moved": {dataset name: documents
    placed elsewhere (another step, lane or row, or not at all) in ``new``}, "config": phrases of what differs}``.
    """
    first = int(state["step"]) if state is not None else 0
    span = range(first, first + steps)
    a, b = explain(old, span, state=state), explain(new, span)
    differing = next((s for s in span if _signature(a, s) != _signature(b, s)), None)
    placed_b = _placed(b)
    moved = Counter(doc[0] for doc, where in _placed(a).items() if placed_b.get(doc) != where)
    return {"first_differing_step": differing, "steps": [span.start, span.stop],
            "moved": {n: moved.get(n, 0) for n in dataset_names(old.datasets)},
            "config": config_diff(new.summary, old.summary, labels=("old config", "new config"))}
