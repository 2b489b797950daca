"""zephon_energon on real torch.distributed (gloo) ranks spawned with torch.multiprocessing.

Oracles: an uninterrupted single-process run (world size 1, no workers) over the same lanes gives the global
batches; the number of complete steps a finite pass can give is counted from the input (sample count, lanes,
chunk size, batch size) in this file, independently of the code under test.
"""
from __future__ import annotations

import os
import time

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("megatron.energon")
pytest.importorskip("webdataset")

import zephon_energon as ze  # noqa: E402
from energon_data import energon_prepare, write_text_tars  # noqa: E402
from energon_jobs import finite_pass_job  # noqa: E402
from torch_jobs import spawn  # noqa: E402

WORLD = 2
R, CHUNK, BATCH = 12, 2, 2  # 6 lanes per rank: 1, 2 and 3 DataLoader workers each own a different share
SHARDS, PER_SHARD = 2, 29   # 58 samples: 29 chunks of 2, so lanes 0-4 get 3 chunks and lanes 5-11 get 2


def lane_samples(n: int, lanes: int, chunk: int) -> list[int]:
    """Samples each lane gets in one pass: the pass cut into chunks of ``chunk`` consecutive positions (the
    last one possibly short), dealt to the lanes in turn (DESIGN.md: a lane owns whole chunks)."""
    per = [0] * lanes
    for g, start in enumerate(range(0, n, chunk)):
        per[g % lanes] += min(chunk, n - start)
    return per


@pytest.fixture(scope="module")
def finite_ds(tmp_path_factory):
    """58 TextSamples (keys ``f0000``..``f0057``) in 2 tars, prepared by megatron-energon, split train = all."""
    root = str(tmp_path_factory.mktemp("energon_finite") / "text")
    keys = write_text_tars(root, shards=SHARDS, per_shard=PER_SHARD, prefix="f")
    energon_prepare(root, {"train": r".*"}, dataset_yaml={
        "sample_type": {"__module__": "megatron.energon", "__class__": "TextSample"}, "field_map": {"text": "txt"}})
    return root, keys


@pytest.mark.contract("energon.elastic")
def test_finite_pass_with_drop_last_same_steps_on_every_rank_for_any_num_workers(finite_ds, tmp_path):
    """``repeat=False, batch_drop_last=True`` on 2 gloo ranks with num_workers 0, 1, 2 and 3: every rank gets the
    same number of batches, the global batches are the single-process run's, whatever the worker count, and
    what is not delivered is counted (``dropped_rows``), exactly the input's incomplete last step and beyond."""
    path, keys = finite_ds
    n = len(keys)
    per_lane = lane_samples(n, R, CHUNK)
    steps = min(p // BATCH for p in per_lane)  # the last step every lane completes
    delivered = steps * R * BATCH
    # The case of the issue: lanes (hence a rank's worker shares) end at different steps.
    assert steps == 2 and max(p // BATCH for p in per_lane[: R // WORLD]) == 3 and n - delivered == 10

    ds = ze.get_train_dataset(path, worker_config=ze.WorkerConfig(rank=0, world_size=1, num_workers=0),
                              batch_size=BATCH, batch_drop_last=True, repeat=False, shuffle_buffer_size=3,
                              max_samples_per_sequence=None, canonical_replicas=R, chunk_size=CHUNK)
    dl = ze.get_savable_loader(ds)
    ref = [list(b.__key__) for b in dl]  # world size 1: one batch per lane per step, lanes ascending
    assert len(ref) == steps * R and all(len(b) == BATCH for b in ref)
    assert dl.dropped_rows == n - delivered
    ref_steps = [ref[R * s:R * (s + 1)] for s in range(steps)]
    ref_keys = sorted(k for b in ref for k in b)
    assert len(set(ref_keys)) == delivered and set(ref_keys) <= set(keys)

    t = time.monotonic()
    runs = spawn(finite_pass_job, WORLD, str(tmp_path), dict(
        path=path, batch_size=BATCH, canonical_replicas=R, chunk_size=CHUNK, shuffle_buffer_size=3,
        workers=[0, 1, 2, 3]))
    elapsed = time.monotonic() - t
    lanes = R // WORLD
    for nw in ("0", "1", "2", "3"):
        ranks = runs[nw]
        assert [len(r["batches"]) for r in ranks] == [steps * lanes] * WORLD, nw  # same step count on every rank
        got = [[b for r in ranks for b in r["batches"][lanes * s:lanes * (s + 1)]] for s in range(steps)]
        assert got == ref_steps, nw  # per step: the same samples, in the same lane batches
        assert sum(r["dropped_rows"] for r in ranks) == n - delivered, nw  # nothing vanishes uncounted
    if os.environ.get("ZEPHON_TEST_TIMINGS"):
        print(f"2 ranks x num_workers 0-3: {elapsed:.1f}s; {steps} steps, {delivered} delivered, "
              f"{n - delivered} dropped")
