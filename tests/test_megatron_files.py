"""Megatron-LM's per-dp data loader files, restored at another dp degree reading only the files needed.

No Megatron-LM process: ``zephon_energon.megatron``'s provider is called with ``args`` and ``dp_rank`` /
``dp_world_size`` as its docstring allows, ranks one after another in this process. The oracle is an
uninterrupted dp 1 run; the files each rank reads are counted at ``torch.load``, below the code under test.
"""
from __future__ import annotations

import os
from types import SimpleNamespace

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("megatron.energon")
pytest.importorskip("webdataset")

from energon_data import text_dataset  # noqa: E402

R, MBS, K, M = 8, 2, 2, 2  # lanes; rows per micro-batch; global steps before the save; steps compared after


@pytest.fixture(scope="module")
def text_path(tmp_path_factory):
    return text_dataset(str(tmp_path_factory.mktemp("megatron_files")))[0]


def _train(path, ckpt, rank, world, *, iteration=0):
    from zephon_energon import megatron as zm

    args = SimpleNamespace(data_path=path, micro_batch_size=MBS, num_workers=0, load=ckpt if iteration else None,
                           dataloader_save=ckpt, iteration=iteration, eval_iters=1, packing_buffer_size=None,
                           canonical_replicas=R)
    return zm.train_valid_test_dataloaders_provider(None, args=args, dp_rank=rank, dp_world_size=world)[0]


def _take(dl, n):
    return [tuple(next(dl).__key__) for _ in range(n)]


def _global(per_rank: list, world: int, steps: int) -> list:
    """Per global step: the ranks' micro-batches of that step in rank order (contiguous lanes: lane order)."""
    per = R // world
    return [[b for rank in per_rank for b in rank[s * per:(s + 1) * per]] for s in range(steps)]


@pytest.mark.contract("megatron.dataloader_state")
def test_restore_at_another_dp_reads_only_the_files_holding_its_lanes(text_path, tmp_path, monkeypatch):
    from zephon_energon import megatron as zm

    ckpt, it = str(tmp_path / "ckpt"), 7
    ref = _global([_take(_train(text_path, ckpt, 0, 1), R * (K + M))], 1, K + M)
    for rank in range(4):  # dp 4 saves after K global steps: each rank writes its own file, as Megatron-LM does
        dl = _train(text_path, ckpt, rank, 4)
        _take(dl, K * R // 4)
        name = zm.default_checkpoint_name(ckpt, it, rank)
        os.makedirs(os.path.dirname(name), exist_ok=True)
        torch.save({"dataloader_state_dict": dl.save_state()}, name)
    real_load, read = torch.load, []

    def counting_load(f, *a, **kw):
        read.append(os.path.basename(f))
        return real_load(f, *a, **kw)
    monkeypatch.setattr(torch, "load", counting_load)
    for world in (2, 8):
        runs = []
        for rank in range(world):
            read.clear()
            dl = _train(text_path, ckpt, rank, world, iteration=it)
            lanes = range(rank * R // world, (rank + 1) * R // world)  # 2 lanes per old rank
            want = sorted({f"train_dataloader_dprank{lane // 2:03d}.pt" for lane in lanes})
            assert sorted(read) == want and len(read) <= -(-4 // world) + 1, (world, rank, read)
            runs.append(_take(dl, M * R // world))
        assert _global(runs, world, M) == ref[K:], world
