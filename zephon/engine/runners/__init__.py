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
           "check_main_guarded", "check_runner", "make_runner"]


def make_runner(name: str, stage, num_workers: int = 2) -> Runner:
    """Build a runner by name.

    name: ``inline``, ``threads`` or ``processes``.
    stage: the ``WorkStage`` the workers run.
    num_workers: threads or processes (an int >= 1; ignored by ``inline``).
    Raises ``ValueError`` for another name or a bad ``num_workers``.
    """
    _check_workers(name, num_workers)
    if name == "inline":
        return InlineRunner(stage)
    if name == "threads":
        return ThreadRunner(stage, num_workers)
    if name == "processes":
        return ProcessRunner(stage, num_workers)
    raise ValueError(f"runner must be one of {RUNNERS}, got {name!r}")


def check_runner(runner, num_workers, stage) -> None:
    """Validate a Loader's ``runner`` and ``num_workers`` when it is built (its runner starts later, lazily).

    runner: a name from ``RUNNERS``, or a ``Runner`` to share. num_workers: threads or processes (an int >= 1;
    ignored by ``inline`` and by a shared runner). stage: the loader's ``WorkStage``, which a shared runner must run.
    Raises ``ValueError`` naming what is wrong; ``UnguardedMainError`` for ``processes`` started from a main script
    without the ``if __name__ == "__main__":`` guard (it would run again in every worker)."""
    if isinstance(runner, Runner):
        if runner.stage.fingerprint() != stage.fingerprint():
            raise ValueError("the shared runner was built for other datasets or operators; build it with "
                             "make_runner(name, loader.stage) from a loader of the same config")
        return
    if runner not in RUNNERS:
        raise ValueError(f"runner must be one of {', '.join(map(repr, RUNNERS))} or a Runner to share "
                         f"(make_runner(name, loader.stage)), got {runner!r}")
    _check_workers(runner, num_workers)
    if runner == "processes":
        check_main_guarded()


def _check_workers(name: str, num_workers) -> None:
    if name in ("threads", "processes") and (not isinstance(num_workers, int) or num_workers < 1):
        raise ValueError(f"num_workers must be an int >= 1 for runner={name!r}, got {num_workers!r}")
