"""Megatron-LM's own training code (megatron-core 0.19.2's ``megatron.training``) drives zephon_energon.

Real gloo ranks (tests/megatron_jobs.py) call Megatron's functions with ``megatron.energon`` swapped for
zephon_energon: ``build_train_valid_test_data_iterators`` (``build_train_valid_test_datasets`` + the provider,
``build_pretraining_data_loader`` with ``--dataloader-type external``, ``RerunDataIterator``),
``maybe_save_dataloader_state`` at dp 2, then the resume at dp 1, 2, 4 and 8.
Oracle: an uninterrupted dp-2 run of the same iterations (no save, no restart); every resumed micro-batch is
compared with it by sample key, global step by global step. The test data is made by the real
``energon prepare`` CLI. Runs where ``megatron.training`` imports (the ``megatron-core-0.19.2`` column of
compat_matrix: ``python -m compat_matrix run --env megatron-core-0.19.2``).
"""
from __future__ import annotations

import glob
import os
import time

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("megatron.energon")
pytest.importorskip("webdataset")
try:
    import megatron.training.checkpointing  # noqa: F401
    import megatron.training.training  # noqa: F401
except Exception as e:  # ImportError, or megatron-core's own failure on an older Python
    pytest.skip(f"megatron.training (megatron-core >= 0.19, CPython >= 3.12) is not importable here: "
                f"{type(e).__name__}: {e}", allow_module_level=True)

from energon_data import energon_prepare_cli, write_text_tars  # noqa: E402
from megatron_jobs import rank_job  # noqa: E402
from torch_jobs import spawn  # noqa: E402

R = 8                # canonical_replicas: every dp degree tried (1, 2, 4, 8) divides it
MBS = 2              # --micro-batch-size
SAVE_AT = 8          # iterations at dp 2 before the save: 2 global steps of R micro-batches
TOTAL_STEPS = 4      # global steps compared (the oracle runs 4 * R / 2 = 16 iterations at dp 2)


@pytest.fixture(scope="module")
def text_ds(tmp_path_factory):
    """64 TextSamples (keys m0000..m0063) in 4 tars, prepared by the real ``energon prepare`` CLI: train = the
    first 3 tars (48 samples: the compared steps cross a pass), val = the last one."""
    root = str(tmp_path_factory.mktemp("megatron") / "text")
    keys = write_text_tars(root, shards=4, per_shard=16, prefix="m")
    energon_prepare_cli(root, {"train": r"text-00[0-2]\.tar", "val": r"text-003\.tar"}, sample_type="TextSample",
                        field_map={"text": "txt"})
    return root, keys


def _run(tmp_path, world, ckpt, path, iters, *, num_workers, save_at=None, load=False):
    t = time.monotonic()
    out = spawn(rank_job, world, str(tmp_path), dict(path=path, ckpt=ckpt, num_workers=num_workers, iters=iters,
                                                     canonical_replicas=R, save_at=save_at, load=load))
    out["seconds"] = round(time.monotonic() - t, 1)
    return out


def _steps(run: dict, world: int) -> list[list[list[str]]]:
    """Global steps of a run: step s = every rank's micro-batches of that step, rank after rank (lanes are dealt
    to ranks in contiguous blocks, so this is lane order). A rank owns R / world lanes, so a step is R / world
    iterations."""
    per = R // world
    n = len(run["batches"][0]) // per
    return [[b for rank in run["batches"] for b in rank[s * per:(s + 1) * per]] for s in range(n)]


@pytest.mark.contract("megatron.loaders", "megatron.dataloader_state")
def test_megatron_training_saves_at_dp2_and_resumes_at_dp_1_2_4_8(text_ds, tmp_path):
    path, keys = text_ds
    ckpt = str(tmp_path / "ckpt")
    oracle = _run(tmp_path, 2, str(tmp_path / "unused"), path, TOTAL_STEPS * R // 2, num_workers=1)
    ref = _steps(oracle, 2)
    assert oracle["iterator"] == "RerunDataIterator"  # Megatron's wrapper of the external loader
    assert len(ref) == TOTAL_STEPS and all(len(step) == R for step in ref)
    flat = [k for step in ref for b in step for k in b]
    assert all(len(b) == MBS for step in ref for b in step)
    assert len(flat) == TOTAL_STEPS * R * MBS and set(flat) <= set(keys[:48])  # the train split's samples only

    first = _run(tmp_path, 2, ckpt, path, SAVE_AT, num_workers=1, save_at=SAVE_AT)
    assert _steps(first, 2) == ref[:SAVE_AT * 2 // R]
    # Megatron's file naming (get_checkpoint_name under --dataloader-save) and zephon_energon's agree.
    from megatron.training.checkpointing import get_checkpoint_name

    from zephon_energon import megatron as zm
    files = sorted(glob.glob(os.path.join(ckpt, "**", "*.pt"), recursive=True))
    want = [os.path.join(ckpt, f"iter_{SAVE_AT:07d}", "mp_rank_00", f"train_dataloader_dprank{r:03d}.pt")
            for r in range(2)]
    assert files == want
    assert [zm.checkpoint_name(ckpt, SAVE_AT, r) for r in range(2)] == want
    assert [zm.default_checkpoint_name(ckpt, SAVE_AT, r) for r in range(2)] == want  # without megatron.training
    assert [get_checkpoint_name(ckpt, SAVE_AT, pipeline_parallel=False, tensor_rank=0, pipeline_rank=0,
                                expert_parallel=False, expert_rank=0,
                                basename=f"train_dataloader_dprank{r:03d}.pt") for r in range(2)] == want
    state = torch.load(want[0], weights_only=True)  # JSON data, no pickle needed
    assert set(state) == {"dataloader_state_dict"}

    table = []
    for world, nw in ((1, 2), (2, 1), (4, 0), (8, 0)):
        iters = (TOTAL_STEPS * R - SAVE_AT * 2) // world
        res = _run(tmp_path, world, ckpt, path, iters, num_workers=nw, load=True)
        assert res["iteration"] == SAVE_AT  # read from Megatron's tracker file
        got = _steps(res, world)
        n_mb = sum(len(b) for b in res["batches"])
        equal = got == ref[SAVE_AT * 2 // R:]
        table.append(f"dp 2 -> {world} (num_workers {nw}): {n_mb} micro-batches, "
                     f"{'all equal' if equal else 'DIFFERENT'} to the uninterrupted run, {res['seconds']} s")
        assert equal, (world, got, ref[SAVE_AT * 2 // R:])
    print("\n" + "\n".join(table) + f"\n(oracle {oracle['seconds']} s, save run {first['seconds']} s)")
