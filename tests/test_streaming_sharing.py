"""zephon_streaming with more ranks than lanes: WORLD_SIZE a multiple of num_canonical_nodes, each rank's batch its
block of its lane's step. Oracle: an uninterrupted WORLD_SIZE 1 run of the same dataset (ids written by the test).
"""
from __future__ import annotations

import json
import threading

import pytest


@pytest.mark.parametrize("workers", [0, 2])
def test_streaming_8_ranks_on_4_lanes_match_one_rank_and_resume(tmp_path, monkeypatch, workers):
    """WORLD_SIZE 8 over num_canonical_nodes=4: each rank yields its block of its lane's step; the global batches
    (ranks' batches in rank order) equal an uninterrupted WORLD_SIZE 1 run's, and a checkpoint taken at 8 ranks
    after 3 steps resumes at 8 and at 2 ranks."""
    pytest.importorskip("torch")
    from torch.utils.data import DataLoader
    from zephon_streaming import StreamingDataset

    d = tmp_path / "train"
    d.mkdir()
    (d / "a.jsonl").write_text("".join(json.dumps({"id": i}) + "\n" for i in range(96)))

    def make(rank, size, **kw):
        monkeypatch.setenv("WORLD_SIZE", str(size))
        monkeypatch.setenv("RANK", str(rank))
        return StreamingDataset(local=str(tmp_path), split="train", batch_size=16 // size, num_canonical_nodes=4,
                                chunk_size=2, shuffle=True, shuffle_seed=3, aggregate_dir=str(tmp_path / "agg"),
                                run_id=f"w{size}-{workers}", **kw)

    one = [int(s["id"]) for s in make(0, 1)]
    ref = [one[i:i + 16] for i in range(0, len(one), 16)]
    assert sorted(one) == list(range(96))
    ranks = [make(r, 8) for r in range(8)]
    assert {len(x) for x in ranks} == {len(one) // 8}
    its = [iter(DataLoader(x, batch_size=2, num_workers=workers)) for x in ranks]
    got = [[i for it in its for i in next(it)["id"].tolist()] for _ in range(3)]
    assert got == ref[:3]
    states = [None] * 8
    ts = [threading.Thread(target=lambda r=r: states.__setitem__(r, ranks[r].state_dict(48, True))) for r in range(8)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(60)
    state = json.loads(json.dumps(states[0]))
    for size in (8, 2):
        again = [make(r, size) for r in range(size)]
        for x in again:
            x.load_state_dict(state)
        its = [iter(DataLoader(x, batch_size=16 // size)) for x in again]
        rest = [[i for it in its for i in next(it)["id"].tolist()] for _ in range(len(ref) - 3)]
        assert rest == ref[3:], size
