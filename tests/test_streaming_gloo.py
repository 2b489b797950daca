"""zephon_streaming under torch.distributed on real gloo processes, as Composer drives it: every rank calls
``state_dict``, rank 0's result is what Composer saves (docs/streaming.md, "What Composer saves"), every rank of
the next run loads it (monolithic: rank 0's file; sharded: through torch.distributed.checkpoint). The lanes
travel to rank 0 only (a gather): the other ranks' results hold their own lanes, and no process group beyond the
job's is made. The oracle: one rank iterated in this process, cut into global batches here.
"""
from __future__ import annotations

import os

import pytest

torch = pytest.importorskip("torch")

from helpers import write_split_jsonl  # noqa: E402
from streaming_jobs import GBS, make_streaming, streaming_job  # noqa: E402
from torch_jobs import spawn_ranks  # noqa: E402

K = 3  # the checkpoint's step


@pytest.fixture(scope="module")
def local(tmp_path_factory):
    return write_split_jsonl(str(tmp_path_factory.mktemp("sgloo")), "a", 3, 120, 0)


@pytest.fixture(scope="module")
def reference(local):
    """Global batches of epoch 0: one rank's samples, ``GBS`` per step."""
    ds = make_streaming(local, 1)
    rows = [(int(s["id"]), s["text"]) for s in ds]
    ds.close()
    return [rows[i:i + GBS] for i in range(0, len(rows), GBS)]


def _spawn(world, tmp, spec):
    return spawn_ranks(streaming_job, world, tmp, spec)


def _global(results):
    """Global batch per step: the ranks' batches in rank order (each rank owns a contiguous block of lanes)."""
    steps = sorted({s for res in results for s, _ in res["rows"]})
    return {s: [tuple(r) for res in results for st, rows in res["rows"] if st == s for r in rows] for s in steps}


@pytest.fixture(scope="module")
def saved4(local, reference, tmp_path_factory):
    """4 ranks run steps 0-2 and Composer's ``state_dict`` is called on each; rank 0's result saved."""
    tmp = str(tmp_path_factory.mktemp("saved4"))
    ckpt, sharded = os.path.join(tmp, "rank0.json"), os.path.join(tmp, "dcp")
    first = _spawn(4, tmp, dict(local=local, start=0, stop=K, save=ckpt, dcp_save=sharded))
    assert _global(first) == {s: [tuple(r) for r in reference[s]] for s in range(K)}
    return dict(tmp=tmp, ckpt=ckpt, sharded=sharded, first=first)


def resumes(local, reference, saved, world, num_workers=0, sharded=False):
    how = dict(dcp_load=saved["sharded"]) if sharded else dict(load=saved["ckpt"])
    out = _spawn(world, saved["tmp"], dict(local=local, start=K, stop=K + 3, num_workers=num_workers, **how))
    assert _global(out) == {s: [tuple(r) for r in reference[s]] for s in range(K, K + 3)}, world


@pytest.mark.contract("streaming.elastic")
def test_state_gathered_to_rank_0_only_and_a_sharded_checkpoint_resumes_at_2(local, reference, saved4):
    """Rank 0's state holds every lane, the others' their own, with no extra process group; saved through DCP as
    Composer's sharded checkpoints are (``dedup_save_to_lowest_rank``: rank 0's value of each key) and loaded
    into the template a fresh dataset's ``state_dict`` makes, it resumes exactly at 2 ranks (1 worker each)."""
    first = saved4["first"]
    assert first[0]["lanes"] == list(range(16))  # rank 0 holds every lane: what Composer saves
    for r, res in enumerate(first[1:], 1):  # the others hold their own 4 lanes, not everyone's
        assert res["lanes"] == res["rank_lanes"] == list(range(4 * r, 4 * r + 4)), r
    assert {res["groups"] for res in first} == {1}  # no process group beyond the job's gloo group
    resumes(local, reference, saved4, 2, num_workers=1, sharded=True)


@pytest.mark.slow
@pytest.mark.contract("streaming.elastic")
def test_state_gathered_to_rank_0_resumes_at_8(local, reference, saved4):
    """Composer's monolithic checkpoint (rank 0's object, as JSON here) on 8 ranks."""
    resumes(local, reference, saved4, 8)
