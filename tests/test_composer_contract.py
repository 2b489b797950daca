"""Composer conformance: ``zephon_streaming.StreamingDataset`` inside a real ``composer.Trainer`` (CPU).

Rows of compat_matrix/contracts.py proven here: ``composer.trainer``, ``composer.resume``, ``composer.elastic``.
The job (model, batch recorder, Trainer arguments) lives in ``composer_job.py``: imported for the one-rank
runs in this process, run under Composer's own launcher (``composer -n N``, gloo) for the multi-rank ones.

The oracle is one uninterrupted single-rank Trainer run (``run_a``); a global batch is the concatenation of
the ranks' batches in rank order (each rank owns a contiguous block of lanes), hashed by
``composer_job.batch_digest``. What Composer 0.32.1 does that these tests rely on:
  * ``State._dataset_state_dict`` calls ``dataset.state_dict(timestamp.sample_in_epoch, True)`` from
    ``checkpoint._save_checkpoint`` -> ``state.state_dict()``, on every rank (only rank 0 writes the file);
    ``sample_in_epoch`` is summed over ranks (``_accumulate_time_across_ranks``) and is 0 at an epoch-end
    checkpoint (saved after ``to_next_epoch``);
  * ``load_path``: ``State._load_dataset_state`` calls ``dataset.load_state_dict`` and sets
    ``dataset_resumption['train']``, so the Trainer neither spins the dataloader nor skips batches: the
    dataset alone resumes; each epoch is ``islice(dataloader, len(dataloader))``;
  * a monolithic checkpoint (rank 0's file) loads at any world size; of the per-rank RNG states it holds,
    rank r restores entry r if there is one, with a warning when the counts differ, and only when resuming
    at batch_in_epoch 0 (a mid-epoch resume with dataset resumption never restores them).
"""
from __future__ import annotations

import json
import os
from collections import Counter
from pathlib import Path

import pytest

pytest.importorskip("composer", reason="mosaicml (Composer) 0.32.1 not installed: it needs torch<2.7.1; run "
                                       "`python -m compat_matrix run --env composer-0.32.1`")

import numpy as np  # noqa: E402
import torch  # noqa: E402

import composer_job as job  # noqa: E402
import composer_launch  # noqa: E402

N = 142            # samples written; any count works: the steps per epoch are computed from the shards below
GBS = 8            # global batch; num_canonical_nodes defaults to it (8 lanes)
JOB = Path(__file__).with_name("composer_job.py")


# -- fixtures: data and the one-rank runs -----------------------------------------------------------
@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return job.write_mds(str(tmp_path_factory.mktemp("composer_mds")), N)


@pytest.fixture(scope="module")
def S(data):
    """Global steps per epoch (the same at every world size), from the shards' own index, not the dataset: a
    one-pass epoch is every sample once, the last global batch filled (Mosaic's rule), so ceil(samples / GBS)."""
    index = json.loads((Path(data) / "train" / "index.json").read_text())
    samples = sum(shard["samples"] for shard in index["shards"])
    assert samples == N
    return -(-samples // GBS)


def every(S: int) -> int:
    """run_b's checkpoint interval in batches: the smallest divisor >= 3 of ``S``, so that the last batch of
    epoch 0 is one of Composer's own "<every>ba" checkpoints, whatever ``S`` the data gives."""
    return next(d for d in range(3, S + 1) if S % d == 0)


@pytest.fixture(scope="module")
def ckdir(tmp_path_factory):
    return tmp_path_factory.mktemp("composer_ckpt")


@pytest.fixture(scope="module")
def plain_run(data):
    """Two epochs, no checkpointing, no DataLoader workers."""
    return job.run(data, batch_size=GBS, max_duration="2ep")


@pytest.fixture(scope="module")
def run_a(data, S, ckdir):
    """The oracle: two epochs uninterrupted, checkpoints after batch 3, at the end of epoch 0 (Composer's
    EPOCH_CHECKPOINT: sample_in_epoch 0 of epoch 1) and 3 batches into epoch 1."""
    return job.run(data, batch_size=GBS, max_duration="2ep", save_folder=str(ckdir / "a"),
                   save_interval=f"at:3,{S + 3},ep")


@pytest.fixture(scope="module")
def run_b(data, S, ckdir):
    """DataLoader num_workers=2 (workers prefetch ahead of the step Composer checkpoints), save_interval
    "<every(S)>ba" (so batch S, the last of epoch 0, is saved at BATCH_CHECKPOINT with sample_in_epoch = a whole
    epoch)."""
    return job.run(data, batch_size=GBS, max_duration="2ep", num_workers=2, save_folder=str(ckdir / "b"),
                   save_interval=f"{every(S)}ba")


def digests(run) -> list[str]:
    return [s["digest"] for s in run["steps"]]


# -- composer.trainer -------------------------------------------------------------------------------
@pytest.mark.contract("composer.trainer")
def test_trainer_trains_on_every_row_of_the_dataset(data, S, plain_run):
    r = plain_run
    assert r["world_size"] == 1 and r["steps_per_epoch"] == r["dataloader_len"] == S
    assert r["final"] == {"epoch": 2, "batch": 2 * S, "sample": 2 * S * GBS}
    steps = r["steps"]
    assert [(s["epoch"], s["batch_in_epoch"], s["batch"]) for s in steps] == \
        [(e, k, e * S + k) for e in range(2) for k in range(S)]
    for s in steps:
        assert len(s["ids"]) == GBS
        assert s["tokens"] == [job.tokens_of(i).tolist() for i in s["ids"]], "a batch row is not its sample"
    # each epoch: every sample once, except the documented one-pass drop (at most lanes x chunk + global batch)
    fill = r["repeated_per_epoch"]
    assert r["len"] == S * GBS == N + fill and 0 <= fill < GBS
    epochs = [[i for s in steps if s["epoch"] == e for i in s["ids"]] for e in range(2)]
    for ids in epochs:
        assert len(ids) == N + fill and set(ids) == set(range(N))
        assert sorted(Counter(ids).values()) == [1] * (N - fill) + [2] * fill
    assert epochs[0] != epochs[1], "each epoch is reshuffled"
    # Composer's batches are exactly the dataset's own order, epoch after epoch (outside any Trainer)
    ds = job.make_dataset(data, GBS)
    try:
        assert epochs == [[int(x["id"]) for x in ds] for _ in range(2)]
    finally:
        ds.close()
    assert r["calls"] == [], "no checkpoint: Composer never asked for the state"
    torch.manual_seed(0)
    assert r["weights"] != job.weights_of(job.TinyClassifier())[0], "the model trained"


@pytest.mark.contract("composer.trainer", "composer.resume")
def test_checkpointing_and_workers_change_neither_batches_nor_weights(plain_run, run_a, run_b):
    assert digests(run_a) == digests(plain_run) == digests(run_b)
    assert run_a["weights"] == plain_run["weights"] == run_b["weights"]


# -- composer.resume --------------------------------------------------------------------------------
@pytest.mark.contract("composer.resume")
def test_composer_state_dict_calls_at_save(S, run_a, run_b):
    """What Composer asks for, and when: state_dict(timestamp.sample_in_epoch, from_beginning=True)."""
    seen = [(c["call"], c["num_samples"], c["from_beginning"], c["epoch"], c["sample_in_epoch"], c["has_lanes"])
            for c in run_a["calls"]]
    assert seen == [("state_dict", 3 * GBS, True, 0, 3 * GBS, True),   # after batch 3
                    ("state_dict", 0, True, 1, 0, False),              # EPOCH_CHECKPOINT: start of epoch 1
                    ("state_dict", 3 * GBS, True, 1, 3 * GBS, True),   # batch S+3
                    ("state_dict", 0, True, 2, 0, False)]              # end of training (epoch end)
    assert all(c["bytes"] < 8192 for c in run_a["calls"])
    # "<E>ba": batches E, 2E, ..., 2S; batch S (the last of epoch 0) names the whole epoch, before to_next_epoch;
    # the end-of-training EPOCH_CHECKPOINT is skipped by Composer (same batch as the last BATCH_CHECKPOINT)
    b = [(c["num_samples"], c["from_beginning"], c["epoch"], c["sample_in_epoch"]) for c in run_b["calls"]]
    assert b == [((k - (k - 1) // S * S) * GBS, True, (k - 1) // S, (k - (k - 1) // S * S) * GBS)
                 for k in range(every(S), 2 * S + 1, every(S))]
    assert (S * GBS, True, 0, S * GBS) in b


RESUMES = [  # (run, checkpoint at global batch (S-relative), epoch in file name, workers on resume)
    pytest.param("a", 3, 0, 0, id="a-ba3-w0"),
    pytest.param("a", 3, 0, 2, id="a-ba3-w2"),
    pytest.param("a", "S", 1, 2, id="a-epoch-end-w2"),
    pytest.param("a", "S+3", 1, 0, id="a-ba(S+3)-w0"),
    pytest.param("b", "mid-b", 0, 0, id="b(w2)-mid-epoch-w0"),
    pytest.param("b", "S", 0, 2, id="b(w2)-last-batch-w2"),
]


def _batch(spec, S) -> int:
    """A checkpoint's global batch; "mid-b": run_b's checkpoint nearest the middle of epoch 0 (9 of 18)."""
    e = every(S)
    return {"S": S, "S+3": S + 3, "mid-b": e * max(1, S // e // 2)}.get(spec, spec)


@pytest.mark.contract("composer.resume")
@pytest.mark.parametrize("src,at,ep,workers", RESUMES)
def test_resume_from_checkpoint_continues_with_identical_batches(data, S, ckdir, run_a, run_b, src, at, ep, workers):
    k = _batch(at, S)
    oracle = run_a
    ckpt = ckdir / src / f"ep{ep}-ba{k}-rank0.pt"
    assert ckpt.is_file(), sorted(os.listdir(ckpt.parent))
    r = job.run(data, batch_size=GBS, max_duration="2ep", num_workers=workers, load_path=str(ckpt))
    assert r["calls"][0]["call"] == "load_state_dict" and r["dataset_resumption"] == {"train": True}
    assert [s["batch"] for s in r["steps"]] == list(range(k, 2 * S)), "resumed at the checkpoint's batch"
    assert digests(r) == digests(oracle)[k:], "a resumed global batch differs from the uninterrupted run's"
    assert r["weights"] == oracle["weights"], "final weights are not bit-identical to the uninterrupted run's"
    assert r["final"] == oracle["final"]


@pytest.mark.contract("composer.trainer", "composer.resume")
def test_streaming_dataloader_in_the_trainer(data, S, ckdir, run_a):
    from zephon_streaming import StreamingDataLoader

    ds = job.make_dataset(data, GBS)
    try:
        assert StreamingDataLoader(ds, batch_size=GBS).batch_size == GBS, \
            "Composer reads the per-rank batch size from train_dataloader.batch_size (as on Mosaic's loader)"
    finally:
        ds.close()
    full = job.run(data, batch_size=GBS, max_duration="2ep", num_workers=2, loader="streaming",
                   save_folder=str(ckdir / "sdl"), save_interval="at:3")
    assert digests(full) == digests(run_a) and full["weights"] == run_a["weights"]
    r = job.run(data, batch_size=GBS, max_duration="2ep", num_workers=2, loader="streaming",
                load_path=str(ckdir / "sdl" / "ep0-ba3-rank0.pt"))
    assert digests(r) == digests(run_a)[3:] and r["weights"] == run_a["weights"]


# -- composer.elastic: Composer's launcher, gloo ----------------------------------------------------
def launch(nproc: int, tmp: Path, *args: str) -> list[dict]:
    """``composer -n nproc composer_job.py args --out tmp/out`` (``composer_launch.launch``)."""
    return composer_launch.launch(JOB, nproc, tmp, *args)


def global_digests(ranks: list[dict]) -> list[str]:
    """Per step, the digest of the ranks' batches concatenated in rank order."""
    return [job.batch_digest([x for s in rows for x in s["ids"]], [t for s in rows for t in s["tokens"]])
            for rows in composer_launch.steps_side_by_side(ranks)]


@pytest.fixture(scope="module")
def two_rank_run(data, S, tmp_path_factory):
    """composer -n 2, per-rank batch GBS/2, checkpoints as ``run_a``'s."""
    tmp = tmp_path_factory.mktemp("composer_two_ranks")
    ranks = launch(2, tmp, "--data", data, "--batch-size", str(GBS // 2), "--max-duration", "2ep",
                   "--save-folder", str(tmp / "ckpt"), "--save-interval", f"at:3,{S + 3},ep")
    return ranks, tmp / "ckpt"


@pytest.mark.contract("composer.elastic", "composer.trainer")
def test_two_ranks_under_the_launcher_give_the_single_rank_global_batches(S, run_a, two_rank_run):
    ranks, _ = two_rank_run
    assert [(r["rank"], r["world_size"]) for r in ranks] == [(0, 2), (1, 2)]
    assert all(r["len"] == S * GBS // 2 and r["dataloader_len"] == S for r in ranks)
    assert global_digests(ranks) == digests(run_a)
    # state_dict ran on every rank with Composer's global sample count; rank 0's result (the one Composer saves)
    # holds every lane and equals the single-rank run's state at the same step; rank 1's holds its own lanes only
    # (the lanes were gathered to rank 0, not all-gathered)
    calls = [[(c["num_samples"], c["from_beginning"], c["epoch"], c["sample_in_epoch"], c["sha256"])
              for c in r["calls"]] for r in ranks]
    assert [c[:4] for c in calls[0]] == [c[:4] for c in calls[1]]
    assert [c[:4] for c in calls[0]] == [(3 * GBS, True, 0, 3 * GBS), (0, True, 1, 0), (3 * GBS, True, 1, 3 * GBS),
                                         (0, True, 2, 0)]
    assert [c[4] for c in calls[0]] == [c["sha256"] for c in run_a["calls"]], \
        "rank 0's state differs from the single-rank run's state at the same step"
    mid = [i for i, c in enumerate(ranks[0]["calls"]) if c["has_lanes"]]
    assert mid == [0, 2]  # the two mid-epoch checkpoints; the epoch ends hold no lanes
    assert [ranks[0]["calls"][i]["lanes"] for i in mid] == [list(range(GBS))] * 2
    assert [ranks[1]["calls"][i]["lanes"] for i in mid] == [list(range(GBS // 2, GBS))] * 2
    assert ranks[0]["weights"] == ranks[1]["weights"]  # DDP keeps the replicas identical


@pytest.mark.contract("composer.elastic", "composer.resume")
@pytest.mark.parametrize("at,ep,workers", [pytest.param(3, 0, 0, id="ba3-w0"),
                                           pytest.param("S", 1, 0, id="epoch-end-w0"),
                                           pytest.param("S+3", 1, 2, id="ba(S+3)-w2")])
def test_checkpoint_on_two_ranks_resumes_on_one(data, S, run_a, two_rank_run, tmp_path, at, ep, workers):
    two, ckpt = two_rank_run
    k = _batch(at, S)
    [r] = launch(1, tmp_path, "--data", data, "--batch-size", str(GBS), "--max-duration", "2ep",
                 "--workers", str(workers), "--load-path", str(ckpt / f"ep{ep}-ba{k}-rank0.pt"))
    assert r["world_size"] == 1 and r["calls"][0]["call"] == "load_state_dict"
    assert [s["batch"] for s in r["steps"]] == list(range(k, 2 * S))
    assert global_digests([r]) == digests(run_a)[k:]
    # Composer restores the per-rank RNG list only at batch_in_epoch 0 (with dataset resumption a mid-epoch
    # resume never restores it); there it keeps rank 0's of the 2 saved and says so
    rng_warned = any("less than the number of RNG state(s)" in w for w in r["warnings"])
    assert rng_warned == (k % S == 0), r["warnings"]
    # the optimisation continues too: one rank of 8 vs two DDP ranks of 4 agree to float rounding
    np.testing.assert_allclose(r["weight_values"], two[0]["weight_values"], rtol=1e-4, atol=1e-5)


@pytest.mark.contract("composer.elastic", "composer.resume")
def test_checkpoint_on_one_rank_resumes_on_two_with_workers(data, S, ckdir, run_a, tmp_path):
    k = 3
    ranks = launch(2, tmp_path, "--data", data, "--batch-size", str(GBS // 2), "--max-duration", "2ep",
                   "--workers", "2", "--load-path", str(ckdir / "a" / f"ep0-ba{k}-rank0.pt"))
    assert all(r["calls"][0]["call"] == "load_state_dict" for r in ranks)
    assert [s["batch"] for s in ranks[0]["steps"]] == list(range(k, 2 * S))
    assert global_digests(ranks) == digests(run_a)[k:]
    np.testing.assert_allclose(ranks[0]["weight_values"], run_a["weight_values"], rtol=1e-4, atol=1e-5)
