"""Save at a midpoint, restore at another dp / worker count, continue: the core Loader and all three adapters.

Every case runs ``resume_oracle.run_test_save_load_state``: the expected stream is an uninterrupted single-rank,
no-worker run of the same API, made in this test; samples are named by an identity the test data carries (an id
column written here, or the WebDataset key), compared per global step.
"""
from __future__ import annotations

import os
import threading

import pytest

from helpers import world, write_split_jsonl
from resume_oracle import Host, run_test_save_load_state

R = 8            # canonical replicas (lanes) everywhere: dp 1, 2, 4, 8 divide it
STEPS, MID = 6, 3


def _take(it, n):
    return [next(it) for _ in range(n)]


# -- core Loader -----------------------------------------------------------------------------------
def core_host(dirs, batching="random"):
    from zephon import Batch, Decode, Loader, Shuffle, merge_states, open_dataset

    datasets = [open_dataset(d) for d in dirs]
    ops = [Decode("id"), Shuffle(4, seed=0), Batch(1)] if batching == "random" else [Decode("id"), Batch(1)]

    def make(dp, rank, workers):
        return Loader(datasets, ops, seed=0, canonical_replicas=R, batching=batching,
                      chunk_size=8, global_batch_size=2 * R, dp_degree=dp, dp_rank=rank,
                      runner="threads" if workers else "inline", num_workers=max(workers, 1))

    def steps(L):
        it = iter(L)
        per_step = len(L.lanes) * (L.rows_per_lane_step // L.batch.micro_batch_size)
        while True:
            yield [x for mb in _take(it, per_step) for x in mb["id"]]

    return Host(make, steps, save=lambda Ls, _: merge_states([L.checkpoint() for L in Ls]),
                load=lambda L, state: L.restore(state), close=lambda L: L.close())


def test_core_loader_resumes_at_other_dp_and_workers(corpus):
    run_test_save_load_state(core_host([corpus["docs_jsonl"], corpus["code_jsonl"]]), steps=STEPS, midpoint=MID,
                             save_at=(2, 2), resume_at=[(1, 0), (4, 1), (8, 2)])


@pytest.mark.parametrize("batching", ["stratified", "per_stream", "device_per_stream"])
def test_core_loader_batching_resumes_at_other_dp_and_workers(corpus, batching):
    run_test_save_load_state(core_host([corpus["docs_jsonl"], corpus["code_jsonl"]], batching), steps=STEPS,
                             midpoint=MID, save_at=(4, 2), resume_at=[(1, 0), (2, 1), (8, 2)])


# -- zephon_torch StatefulDataLoader ---------------------------------------------------------------
def torch_host(dirs):
    pytest.importorskip("torch")
    pytest.importorskip("torchdata")
    import zephon_torch
    from zephon import Batch, Decode, Shuffle, merge_states, open_dataset

    def make(dp, rank, workers):
        ds = zephon_torch.ZephonIterableDataset(
            [open_dataset(d) for d in dirs], [Decode("id"), Shuffle(4, seed=0), Batch(2)], dp_degree=dp,
            dp_rank=rank, seed=0, canonical_replicas=R, chunk_size=8, global_batch_size=2 * R)
        return zephon_torch.StatefulDataLoader(ds, num_workers=workers)

    def steps(dl):
        it = iter(dl)
        while True:  # 2 rows per lane step = one micro-batch of Batch(2): one batch (all the rank's lanes) a step
            yield list(next(it)["id"])

    return Host(make, steps, save=lambda dls, _: merge_states([dl.state_dict() for dl in dls]),
                load=lambda dl, state: dl.load_state_dict(state))


def test_torch_stateful_dataloader_resumes_at_other_dp_and_workers(corpus):
    run_test_save_load_state(torch_host([corpus["docs_jsonl"], corpus["code_jsonl"]]), steps=STEPS, midpoint=MID,
                             save_at=(2, 2), resume_at=[(1, 0), (4, 3)])


# -- zephon_streaming StreamingDataset -------------------------------------------------------------
def streaming_host(root):
    pytest.importorskip("torch")
    from zephon_streaming import StreamingDataLoader, StreamingDataset

    local, agg = write_split_jsonl(root, "a", 3, 60, 0), os.path.join(root, "agg")
    gbs = 2 * R

    def make(dp, rank, workers):
        with world(rank, dp):
            ds = StreamingDataset(local=local, split="train", batch_size=gbs // dp, shuffle=True, shuffle_seed=17,
                                  chunk_size=4, aggregate_dir=agg)
        return StreamingDataLoader(ds, batch_size=ds.batch_size, num_workers=workers)

    def steps(dl):
        it = iter(dl)
        while True:
            yield [int(i) for i in next(it)["id"]]

    def save(dls, done):
        """Composer's save: ``state_dict(samples seen)`` on every rank at once (one thread per rank)."""
        out = [None] * len(dls)

        def call(i):
            out[i] = dls[i].dataset.state_dict(done * gbs, True)

        ts = [threading.Thread(target=call, args=(i,)) for i in range(len(dls))]
        for t in ts:
            t.start()
        for t in ts:
            t.join(60)
        assert all(o == out[0] for o in out), "ranks disagree on the global state"
        return out[0]

    return Host(make, steps, save=save, load=lambda dl, state: dl.dataset.load_state_dict(state))


def test_streaming_dataset_resumes_at_other_world_size_and_workers(tmp_path):
    run_test_save_load_state(streaming_host(str(tmp_path)), steps=STEPS, midpoint=MID, save_at=(4, 2),
                             resume_at=[(1, 0), (2, 1), (8, 0)])


# -- zephon_energon savable loader -----------------------------------------------------------------
def energon_host(root):
    pytest.importorskip("torch")
    pytest.importorskip("megatron.energon")
    from energon_data import energon_prepare, write_text_tars

    import zephon_energon as ze

    write_text_tars(root, shards=4, per_shard=25)  # 100 samples: 6 global steps of 16 read each one once
    energon_prepare(root, {"train": r".*"}, dataset_yaml={
        "sample_type": {"__module__": "megatron.energon", "__class__": "TextSample"}, "field_map": {"text": "txt"}})

    def make(dp, rank, workers):
        wc = ze.WorkerConfig(rank=rank, world_size=dp, num_workers=workers)
        return ze.get_savable_loader(ze.get_train_dataset(root, worker_config=wc, batch_size=2, shuffle_buffer_size=4,
                                                          max_samples_per_sequence=None, canonical_replicas=R))

    def steps(dl):
        it = iter(dl)
        while True:  # one batch per lane of this rank per global step
            yield [k for b in _take(it, R // dl.worker_config.world_size) for k in b.__key__]

    return Host(make, steps, save=lambda dls, _: [dl.save_state_rank() for dl in dls],
                load=lambda dl, states: dl.restore_state_global(states), close=lambda dl: dl.close())


def test_energon_savable_loader_resumes_at_other_world_size_and_workers(tmp_path):
    run_test_save_load_state(energon_host(str(tmp_path / "text")), steps=STEPS, midpoint=MID, save_at=(4, 2),
                             resume_at=[(1, 0), (2, 1), (8, 0)])
