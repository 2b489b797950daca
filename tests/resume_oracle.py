"""One host-resume oracle for the core Loader and every adapter, after torchdata's ``run_test_save_load_state``.

``run_test_save_load_state(host, steps, midpoint, save_at, resume_at)``: iterate a run at ``save_at`` = (dp,
workers) for ``midpoint`` global steps, save, restore the state (through JSON) into fresh objects at each
``resume_at`` (dp, workers), iterate to ``steps``, and compare every global step with one uninterrupted
single-rank, no-worker run by sample identity. The expected value is that uninterrupted run, made here from
the host's own iteration; never the code under test's checkpoint. A ``Host`` says how to drive one API.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Callable, Iterator


@dataclass
class Host:
    """How the oracle drives one loader API.

    make: (dp, rank, workers) -> a fresh loader object for that rank.
    steps: loader -> iterator of this rank's share of each global step, as a list of sample identities
        (hashable); it must not pull past the end of a step before it yields that step.
    save: (loaders of every rank, global steps done) -> the state to restore from (JSON data).
    load: (fresh loader, state) -> None, before its first ``steps``.
    close: loader -> None.
    """

    make: Callable[[int, int, int], Any]
    steps: Callable[[Any], Iterator[list]]
    save: Callable[[list, int], Any]
    load: Callable[[Any, Any], None]
    close: Callable[[Any], None] = lambda loader: None


def global_steps(host: Host, dp: int, workers: int, steps: int, state=None) -> tuple[list[list], list]:
    """``steps`` global steps of a run on ``dp`` ranks (one process, ranks taken in turn) with ``workers``.

    Returns (per global step the sorted sample identities of every rank's share, the rank loaders, still open).
    state: restored into every rank's fresh loader first (None: a fresh start).
    """
    loaders = [host.make(dp, r, workers) for r in range(dp)]
    if state is not None:
        for loader in loaders:
            host.load(loader, state)
    its = [host.steps(loader) for loader in loaders]
    out = [sorted(x for it in its for x in next(it)) for _ in range(steps)]
    return out, loaders


def _run(host: Host, dp: int, workers: int, steps: int, state=None, save=False) -> tuple[list[list], Any]:
    rows, loaders = global_steps(host, dp, workers, steps, state)
    saved = host.save(loaders, steps) if save else None
    for loader in loaders:
        host.close(loader)
    return rows, saved


def run_test_save_load_state(host: Host, *, steps: int, midpoint: int, save_at: tuple[int, int],
                             resume_at: list[tuple[int, int]]) -> None:
    """Assert that resuming at every ``resume_at`` continues the uninterrupted stream exactly.

    host: the API under test. steps: global steps compared in all. midpoint: global steps before the save.
    save_at: (dp, workers) of the saving run. resume_at: (dp, workers) of each resumed run.
    Raises AssertionError naming the run and the first global step that differs.
    """
    expected, _ = _run(host, 1, 0, steps)
    assert all(expected), "the uninterrupted run delivered an empty global step"
    assert len({x for step in expected for x in step}) > len(expected[0]), "the stream repeats one batch"
    head, state = _run(host, *save_at, midpoint, save=True)
    _same(head, expected[:midpoint], f"saving run at dp={save_at[0]}, workers={save_at[1]}", 0)
    state = json.loads(json.dumps(state))  # checkpoints are JSON: what survives a file survives here
    for dp, workers in resume_at:
        tail, _ = _run(host, dp, workers, steps - midpoint, state)
        _same(tail, expected[midpoint:], f"resume at dp={dp}, workers={workers}", midpoint)


def _same(got: list[list], want: list[list], what: str, first_step: int) -> None:
    for k, (g, w) in enumerate(zip(got, want)):
        assert g == w, (f"{what}: global step {first_step + k} differs from the uninterrupted run: "
                        f"{len(set(g) - set(w))} unexpected, {len(set(w) - set(g))} missing samples "
                        f"(e.g. {sorted(set(g) ^ set(w))[:3]})")
    assert len(got) == len(want), f"{what}: {len(got)} global steps, expected {len(want)}"
