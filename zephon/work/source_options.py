"""``WorkSource``'s argument checks (weights, quotas, epochs per pass, options), one place for their messages."""
from __future__ import annotations

from .schedule import Schedule

EXHAUSTION_POLICIES = ("repeat", "stop", "fill", "quota")


def checked_weights(datasets, weights):
    """``WorkSource``'s weights, one per dataset (default: equal).

    datasets: the source's datasets. weights: None, a list of numbers or a ``Schedule``.
    Raises ValueError for no dataset, or weights (or a schedule) for another number of datasets.
    """
    if not datasets:
        raise ValueError("WorkSource needs at least one dataset")
    if weights is None:
        weights = [1] * len(datasets)
    if isinstance(weights, Schedule):
        if weights.num_datasets != len(datasets):
            raise ValueError(f"a schedule of {weights.num_datasets} datasets for {len(datasets)} datasets")
    elif len(weights) != len(datasets):
        raise ValueError(f"{len(weights)} mixture weights for {len(datasets)} datasets")
    return weights


def checked_epochs(epochs, n: int) -> list[int] | None:
    """``epochs_per_pass``: None (all 1) or one int >= 1 per dataset. Raises ValueError otherwise."""
    if epochs is None or all(m == 1 for m in epochs):
        return None
    if len(epochs) != n or not all(isinstance(m, int) and not isinstance(m, bool) and m >= 1 for m in epochs):
        raise ValueError(f"epochs_per_pass needs one int >= 1 per dataset ({n}), got {epochs!r}")
    return [int(m) for m in epochs]


def checked_quota(weights) -> list[int]:
    """``exhaustion="quota"``'s weights: draws per dataset in one pass. Raises ValueError unless ints >= 1."""
    if isinstance(weights, Schedule) or not all(isinstance(w, int) and not isinstance(w, bool) and w >= 1
                                                for w in weights):
        raise ValueError(f"exhaustion='quota' needs one int >= 1 per dataset (its draws in one pass), got {weights!r}")
    return [int(w) for w in weights]


def check_options(seed, canonical_replicas, chunk_size, exhaustion, fill_multiple, shuffle_block_size) -> None:
    """``WorkSource``'s option checks (arguments as there). Raises ValueError naming the bad option."""
    if not all(isinstance(v, int) for v in (canonical_replicas, chunk_size, seed)):
        raise ValueError(f"canonical_replicas, chunk_size and seed must be ints, got "
                         f"{canonical_replicas!r}, {chunk_size!r}, {seed!r}")
    if canonical_replicas < 1 or chunk_size < 1:
        raise ValueError(f"canonical_replicas and chunk_size must be >= 1, got {canonical_replicas}, {chunk_size}")
    if exhaustion not in EXHAUSTION_POLICIES:
        raise ValueError(f"exhaustion must be one of {EXHAUSTION_POLICIES}, got {exhaustion!r}")
    if not isinstance(fill_multiple, int) or fill_multiple < 1:
        raise ValueError(f"fill_multiple must be an int >= 1, got {fill_multiple!r}")
    if shuffle_block_size is not None and shuffle_block_size < 1:
        raise ValueError(f"shuffle_block_size must be >= 1 or None, got {shuffle_block_size}")


def checked_step(what: str, step_size, exhaustion: str, lanes: int, weights=None) -> int:
    """Positions per global step for an allocation in step-major order (a schedule, a batching composition,
    ``step_major``). what: the option asking, as named in errors. step_size: positions per step. exhaustion: the
    stream's policy. lanes: canonical_replicas. weights: a batching composition's weights (refused as a schedule).
    Raises ``ValueError`` unless the stream is endless, the weights fixed, and the step a multiple of ``lanes``."""
    schedule = " and a schedule" if isinstance(weights, Schedule) else ""
    if exhaustion != "repeat" or schedule:
        raise ValueError(f"{what} needs {'fixed weights and ' if weights is not None else ''}an endless stream "
                         f"(exhaustion='repeat'), got exhaustion={exhaustion!r}{schedule}")
    if not isinstance(step_size, int) or step_size < 1 or step_size % lanes:
        raise ValueError(f"{what} needs positions per step (step_size, or a schedule's positions_per_step) that are "
                         f"a multiple of canonical_replicas={lanes}, got {step_size!r}")
    return step_size
