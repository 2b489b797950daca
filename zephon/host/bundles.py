"""A host worker's items grouped per step: one transfer per step and worker, not one per lane micro-batch.

A host such as torch's DataLoader pays a fixed cost per item that crosses from a worker to the training process (a
pickle, a pipe read, its own bookkeeping: about 0.1 ms on these machines). A worker holding 8 lanes sent 8 items per
step; grouped, it sends one, and the consuming process flattens the groups before ``RankSession.ordered_groups``
(which takes items in any interleaving). Nothing else changes: the same items, in the same order.
"""
from __future__ import annotations


def last_micro_index(plan) -> int:
    """The index of a lane's last micro-batch of a step on this rank (of its block when ranks share the lane)."""
    return (plan.share_index + 1) * (plan.rows_per_rank_step // plan.batch.micro_batch_size) - 1


def step_bundles(items, lanes: list[int], last_micro: int):
    """Group ``items`` (``RankSession.worker_items``' ``(meta, payload)``, in the order the worker makes them) into
    lists, one per step; closing this closes ``items``.

    lanes: the worker's lanes (``worker_lanes``). last_micro: ``last_micro_index`` of the plan. A step's list is
    yielded as soon as each of ``lanes`` gave its last micro-batch's last item (so the first step does not wait for
    the second), or when an item of another step comes (a lane that ended or resumed mid-pass gives no item for a
    step); the final list holds what is left, the ``dropped_rows`` report included."""
    bundle, step, due = [], None, set()
    try:
        for meta, payload in items:
            s = meta.get("step")  # None: the dropped_rows report that ends a finite stream
            if bundle and s != step:
                yield bundle
                bundle = []
            if not bundle:
                step, due = s, set(lanes)
            bundle.append((meta, payload))
            if s is not None and meta["last"] and meta["micro"] == last_micro:
                due.discard(meta["lane"])
                if not due:
                    yield bundle
                    bundle = []
        if bundle:
            yield bundle
    finally:
        close = getattr(items, "close", None)  # a generator's (worker_items closes its Loader)
        if close is not None:
            close()
