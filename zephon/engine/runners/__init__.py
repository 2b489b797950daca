"""Where work functions run: ``inline``, ``threads`` or ``processes``. A pure performance knob:
results are released by sequence number, so the runner never changes the output.

``processes`` (``runners.processes``): worker processes that exit with their parent, are replaced when
they die (their units re-run) and hand large arrays over in shared memory (``engine.shm``).
"""
from __future__ import annotations

from .base import InlineRunner, Runner, ThreadRunner
from .processes import ProcessRunner, WorkerDied
from .guard import UnguardedMainError, check_main_guarded

RUNNERS = ("inline", "threads", "processes")

__all__ = ["RUNNERS", "InlineRunner", "ProcessRunner", "Runner", "ThreadRunner", "UnguardedMainError", "WorkerDied",
           "check_main_guarded", "make_runner"]


def make_runner(name: str, stage, num_workers: int = 2) -> Runner:
    """Build a runner by name.

    name: ``inline``, ``threads`` or ``processes``.
    stage: the ``WorkStage`` the workers run.
    num_workers: threads or processes (an int >= 1; ignored by ``inline``).
    Raises ``ValueError`` for another name or a bad ``num_workers``.
    """
    if name in ("threads", "processes") and (not isinstance(num_workers, int) or num_workers < 1):
        raise ValueError(f"num_workers must be an int >= 1 for the {name} runner, got {num_workers!r}")
    if name == "inline":
        return InlineRunner(stage)
    if name == "threads":
        return ThreadRunner(stage, num_workers)
    if name == "processes":
        return ProcessRunner(stage, num_workers)
    raise ValueError(f"runner must be one of {RUNNERS}, got {name!r}")
