"""Loss curves that do not move when the GPU count changes: ``python -m benchmarks --only loss``.

A small decoder-only LM (``model``) trained on the demo corpus (``data``) with data-parallel ranks
simulated in one process (``experiment``), fed by Zephon and by its peers used as their users use them
(``baselines``, ``hosts``); checked against real DDP (``ddp``); tables and figures (``report``, ``plot``),
orchestrated by ``run``. Results and reading notes: docs/loss-curves.md.
"""


def child_peer(cfg: dict) -> dict:
    """``python -m benchmarks.child loss.peer JSON``: one loader's two experiments (``run.child_peer``)."""
    from .run import child_peer as run_one

    return run_one(cfg)
