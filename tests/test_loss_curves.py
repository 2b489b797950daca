"""Smoke test of the loss-curve experiment (benchmarks/loss, quick mode, Zephon only): training on Zephon
gives exactly the same per-step losses on every simulated rank count and after a checkpoint/resume on
another rank count. The oracle is computed here: one uninterrupted run fed by a single-rank
``zephon.Loader`` (dp_degree=1), whose global batches are its micro-batches of a step in lane order."""
from __future__ import annotations

import os
import sys
from dataclasses import replace
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("matplotlib")

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def setup():
    sys.path.insert(0, str(REPO))
    from benchmarks.loss import data
    from benchmarks.loss.experiment import QUICK
    from benchmarks.loss.model import setup_torch
    from zephon.demo_corpus import default_workdir

    setup_torch()
    s = replace(QUICK, peers=("zephon",))
    m = data.prepare(os.environ.get("ZEPHON_DEMO_DIR") or default_workdir(), s.model.vocab, s.model.seq_len,
                     s.heldout_rows)
    return s, m, data.heldout(m)


def uninterrupted_losses(s, m) -> list[float]:
    """One rank, no checkpoint: the reference every simulated run must reproduce bit for bit."""
    from benchmarks.loss.model import Trainer
    from zephon import Batch, Decode, Loader, Pack, Shuffle, Tokenize, open_dataset

    L = s.model.seq_len + 1
    loader = Loader([open_dataset(m["train_files"], name="demo-train")],
                    [Decode("text"), Tokenize(m["tokenizer"], eos_id="<eos>", max_length=L), Pack(L),
                     Shuffle(8, seed=0), Batch(1)],
                    seed=0, canonical_replicas=s.replicas, chunk_size=s.chunk_size, global_batch_size=s.rows,
                    dp_degree=1, dp_rank=0, runner="inline")
    it = iter(loader)
    tr = Trainer(replace(s.model, steps=s.steps))
    losses = []
    for step in range(s.steps):
        mbs = [next(it) for _ in range(s.rows)]  # Batch(1), one row per lane per step: lanes ascending
        assert [int(mb["__lane__"]) for mb in mbs] == list(range(s.replicas))
        x = torch.stack([torch.as_tensor(mb["input_ids"][0][:-1]).long() for mb in mbs])
        y = torch.stack([torch.as_tensor(mb["labels"][0][1:]).long() for mb in mbs])
        losses.append(tr.step(x, y, step))
    loader.close()
    return losses


def test_zephon_loss_curves_coincide_across_rank_counts_and_resumes(setup):
    from benchmarks.loss.experiment import run_peer

    s, m, heldout = setup
    ref = uninterrupted_losses(s, m)
    assert len(ref) == s.steps and ref[-1] < ref[0]  # it trains
    res = run_peer("zephon", m, s, heldout, log=lambda _: None)
    assert sorted(res["scratch"]) == sorted(s.scratch_dps)
    for D, run in res["scratch"].items():
        assert run["losses"] == ref, f"from scratch on {D} ranks"
    k = s.ckpt_step
    assert sorted(res["resume"]) == sorted(s.resume_dps)
    for M, run in res["resume"].items():
        assert "refused" not in run, run
        assert run["losses"] == ref[k:], f"checkpoint at step {k} on {s.ckpt_dp} ranks, resumed on {M}"
        assert run["max_abs_diff"] == 0 and run["equal_batches"] == s.steps - k
    finals = {run["final_heldout"] for run in list(res["scratch"].values()) + list(res["resume"].values())}
    assert len(finals) == 1  # one model at the end, whatever the rank counts
