"""Per-rank checkpoints on real gloo processes: 16 ranks -> 8 and 32, 32 -> 16, each restoring rank reading only
the entry files it needs; global batches equal to an uninterrupted single-rank run computed here.

Slow (16 and 32 spawned processes on the shared 2 cores): ``pytest -m slow tests/test_rank_states_dist.py``.
"""
from __future__ import annotations

import math
import os
from collections import defaultdict

import pytest

pytest.importorskip("torch")

from benchmarks.ranks import base_plan, rank_loader, run_rank, write_corpus  # noqa: E402

LANES = 32
STEPS = 4
K = 2  # the checkpoint's step


def _spawn(world, tmp, spec):
    from rank_jobs import rank_job
    from torch_jobs import spawn_ranks

    return spawn_ranks(rank_job, world, tmp, spec)


def _global(results):
    rows = defaultdict(list)
    for res in results:  # rank order: ranks sharing a lane deliver its blocks in that order
        for step, lane, text in res["rows"]:
            rows[(step, lane)].append(text)
    return dict(rows)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    return write_corpus(str(tmp_path_factory.mktemp("rankdist")), docs=2000)


@pytest.fixture(scope="module")
def reference(corpus):
    rows = defaultdict(list)
    L = rank_loader(base_plan(corpus, LANES, rows_per_lane_step=2), 1, 0)
    run_rank(L, STEPS, lambda mb: rows[(mb["__step__"], mb["__lane__"])].extend(mb["text"]))
    L.close()
    assert len(rows) == STEPS * LANES
    return dict(rows)


@pytest.mark.slow
@pytest.mark.parametrize("saved, restores", [(16, (8, 32)), (32, (16,))])
def test_gloo_per_rank_save_and_selective_restore(corpus, reference, tmp_path, saved, restores):
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    first = _spawn(saved, str(tmp_path), dict(corpus=corpus, lanes=LANES, start=0, stop=K, save=str(ckpt)))
    assert _global(first) == {k: v for k, v in reference.items() if k[0] < K}
    assert sorted(os.listdir(ckpt)) == sorted(f"rank-{r}.json" for r in range(saved))
    assert {res["groups"] for res in first} == {1}  # saving made no process group beyond the default one
    for new in restores:
        out = _spawn(new, str(tmp_path), dict(corpus=corpus, lanes=LANES, start=K, stop=STEPS, load=str(ckpt),
                                             load_dp=saved))
        assert _global(out) == {k: v for k, v in reference.items() if k[0] >= K}, new
        for r, res in enumerate(out):
            per = max(1, saved // new)  # the old ranks holding rank r's lanes, from the layout
            first_old = r * saved // new
            assert res["read"] == [f"rank-{o}.json" for o in range(first_old, first_old + per)], (new, r)
            assert len(res["read"]) <= math.ceil(saved / new) + 1
