"""What a Loader counts: per-iteration skip limits (``SkipLedger``), the dry-lane limit, and the bodies of
``Loader.stats()`` and ``Loader.metrics()`` (documented on those methods)."""
from __future__ import annotations

from .plan import LoaderPlan, dataset_names
from .sharing import shared_stats
from .stage import SkipLedger


def new_ledger(plan: LoaderPlan, lanes: list[int], max_skip_fraction) -> SkipLedger:
    """Per-dataset skip accounting for one iteration of the loader owning ``lanes`` (``stage.SkipLedger``).

    plan: the ``LoaderPlan``. lanes: the owned lanes. max_skip_fraction: as ``Loader``'s (validated here:
    ``SkipLedger`` raises ``ValueError`` for a bad one)."""
    R, n, sizes = plan.canonical_replicas, max(1, len(lanes)), plan.source.sizes
    share = [-(-size * n // R) for size in sizes]
    return SkipLedger(plan.datasets, max_skip_fraction, share, sizes, endless=not plan.finite)


def dry_limit(plan: LoaderPlan) -> int | None:
    """Pointers a lane of an endless stream may read without producing a row: a whole pass of the data
    (every dataset once at its mixture weight, as if one lane read it all) plus two flush spans and a
    unit. A lane past that can produce nothing (every sample skipped or filtered): an error, not a spin.
    None for a finite stream."""
    if plan.finite:
        return None
    w = plan.source.mixture.weights
    total = sum(w)
    full = max([-(-size * total // w[d]) for d, size in enumerate(plan.source.sizes) if size] or [0])
    return full + 2 * plan.flush_span + plan.unit_size


def loader_stats(loader) -> dict:
    """``Loader.stats()`` of ``loader`` (its lock held)."""
    sts = loader.lane_pipelines()
    dropped, padded = loader.dropped_rows, loader.padded_rows
    msgs = [m for s in sts for m in s.skipped_messages][:20]
    out = {"skipped": sum(s.skipped for s in sts), "skipped_messages": msgs,
           "filtered": sum(s.filtered for s in sts), "replayed_rows": sum(s.replayed_rows for s in sts),
           "dropped_rows": dropped, "padded_rows": padded,
           "delivered_rows": sum(s.delivered_rows for s in sts) - dropped - padded}
    if loader.lane_shares > 1:  # the lane's rows are shared: count this rank's block of them (one lane)
        out.update(shared_stats(loader, sum(s.delivered_rows for s in sts), padded, dropped))
    return out


#: seconds ``Loader.metrics()`` waits for the loader's lock before it reuses the lanes' facts of its previous read
METRICS_LOCK_S = 0.05


def loader_metrics(loader) -> dict:
    """``Loader.metrics()`` of ``loader``. The counts (``MetricsCounter``) have their own lock; only the facts read
    off the lanes (the step for ``target_share``, ``skipped``, ``filtered``) need the loader's. The inline runner
    holds that lock through the work inside ``next()`` (seconds for a slow unit): a read from another thread (a
    Prometheus scrape) then does not wait for it but reuses those facts as of its previous read."""
    lock = loader._lock
    if lock.acquire(timeout=METRICS_LOCK_S if loader._lane_facts is not None else -1):
        try:
            loader._lane_facts = _lane_facts(loader)
        finally:
            lock.release()
    return loader._metrics.snapshot(names=dataset_names(loader.datasets), **loader._lane_facts)


def _lane_facts(loader) -> dict:
    """What ``loader_metrics`` reads holding the loader's lock: ``target`` (the mixture's shares at the current
    step), ``workers``, and the samples ``skipped`` and records ``filtered`` (those of earlier iterations too)."""
    sts = loader.lane_pipelines()
    step = min((s.lane_cursor().step(loader.rows_per_lane_step) for s in sts), default=0)
    source = loader.source
    weights = list(source.schedule.shares(step)) if source.schedule is not None else list(source.mixture.weights)
    total = sum(weights) or 1
    earlier = loader._skips  # skipped and filtered by the lanes of its iterations before the current one
    return {"target": [float(w / total) for w in weights],
            "workers": 1 if loader._runner_spec == "inline" else loader.num_workers,
            "skipped": earlier[0] + sum(s.skipped for s in sts), "filtered": earlier[1] + sum(s.filtered for s in sts)}
