"""TorchTitan's own Trainer, CheckpointManager and config system driving Zephon (issue 31).

Real ranks under ``torchrun`` on CPU (gloo), TorchTitan's llama3 debug model, the batches the Trainer
receives logged per rank (benchmarks/titan/train.py). The oracle is an uninterrupted run of the same job:
a run resumed at another dp degree through TorchTitan's load path must train on the same global batches.
TorchTitan's own loader (``ParallelAwareDataloader``) is run the same way and refuses the dp change.
The CPU patch (device selection, FlexAttention backward) and why: benchmarks/titan/cpu.py.
"""
from __future__ import annotations

import os
import shutil

import pytest

pytest.importorskip("torchtitan.trainer", reason="torchtitan not installed: the TorchTitan Trainer rows need it")

from benchmarks.titan.launch import global_batches, tail, torchrun  # noqa: E402

GLOBAL_BATCH = 8  # rows per global step; canonical_replicas 4, so dp 1, 2 and 4 all divide it
#: How TorchTitan's own loader stops a resume at another dp degree: fewer ranks reach its load_state_dict's
#: assert; more ranks ask DCP for per-rank entries the checkpoint does not have.
REFUSALS = {(4, 2): "dataloader resharding is not supported",
            (2, 4): "Missing key in checkpoint state_dict: dataloader.dp_rank_2"}


def zephon_args(corpus, tokenizer_path, dump, *, dp, steps, interval):
    """TorchTitan's command line for the Zephon debug job (the one docs/distributed.md shows)."""
    return ["--module", "zephon_torch.titan_config", "--config", "zephon_llama3_debugmodel",
            "--hf_assets_path", os.path.dirname(tokenizer_path),
            "--dataloader.dataset_path", f"{corpus['docs_jsonl']},{corpus['code_parquet']}",
            "--dataloader.weights", "0.7", "0.3", "--dataloader.canonical_replicas", "4",
            "--dataloader.chunk_size", "32", "--dataloader.shuffle_buffer", "4",
            *common_args(dump, dp=dp, steps=steps, interval=interval)]


def titan_args(corpus, tokenizer_path, dump, *, dp, steps, interval):
    """The same job with TorchTitan's own HF text loader (benchmarks/titan/configs.py)."""
    return ["--module", "benchmarks.titan.configs", "--config", "titan_hf_debugmodel",
            "--hf_assets_path", os.path.dirname(tokenizer_path), "--dataloader.dataset_path", corpus["docs_jsonl"],
            *common_args(dump, dp=dp, steps=steps, interval=interval)]


def common_args(dump, *, dp, steps, interval):
    return ["--training.seq_len", "64", "--training.local_batch_size", str(GLOBAL_BATCH // dp),
            "--training.steps", str(steps), "--dump_folder", dump, "--metrics.log_freq", "1",
            "--checkpoint.enable", "--checkpoint.interval", str(interval)]


def run(tmp, name, dp, args, *, expect_ok=True):
    """One torchrun of the Trainer on ``dp`` CPU ranks; ``(exit code, global batches, log path)``."""
    log, digests = os.path.join(tmp, f"{name}.log"), os.path.join(tmp, f"{name}-digests")
    rc = torchrun(dp, args, digests=digests, cpu=True, log=log)
    if expect_ok:
        assert rc == 0, f"{name}: torchrun exited {rc}\n{tail(log)}"
    return rc, (global_batches(digests) if os.path.isdir(digests) else {}), log


def resume_dump(tmp, name, src_dump, step):
    """A fresh dump folder holding only ``src_dump``'s checkpoint of ``step`` (TorchTitan loads the latest)."""
    dump = os.path.join(tmp, name)
    shutil.copytree(os.path.join(src_dump, "checkpoint", f"step-{step}"),
                    os.path.join(dump, "checkpoint", f"step-{step}"))
    return dump


def dcp_keys(dump, step):
    """The DCP keys TorchTitan's CheckpointManager wrote at ``step`` that belong to the data loader."""
    from torch.distributed.checkpoint import FileSystemReader

    meta = FileSystemReader(os.path.join(dump, "checkpoint", f"step-{step}")).read_metadata()
    return sorted(k for k in meta.state_dict_metadata if k.startswith("dataloader."))


def rank_keys(dp):
    """TorchTitan's per-rank shape of a loader saved on ``dp`` ranks, as DCP keys (both loaders write it)."""
    return sorted([f"dataloader.dp_rank_{r}" for r in range(dp)] + ["dataloader.world_size"])


def check_resume(full, resumed, k, steps, label):
    """The resumed run trained steps k+1..steps (so TorchTitan loaded step k) on the uninterrupted run's
    global batches; returns the number of steps compared."""
    assert sorted(resumed) == list(range(k + 1, steps + 1)), f"{label}: resumed steps {sorted(resumed)}"
    for s in resumed:
        assert len(resumed[s]) == GLOBAL_BATCH, f"{label}: step {s} has {len(resumed[s])} rows"
        assert resumed[s] == full[s], f"{label}: global batch of step {s} differs from the uninterrupted run's"
    return len(resumed)


@pytest.mark.contract("torchtitan.trainer.config")
def test_torchtitan_config_selects_zephon(corpus, tokenizer_path):
    """TorchTitan's ConfigManager (``--module/--config`` + CLI overrides) yields Zephon's loader config with
    the command line's values, and ``config.dataloader.build(...)`` with the Trainer's keywords builds it."""
    from torchtitan.components.tokenizer import HuggingFaceTokenizer
    from torchtitan.config import ConfigManager

    from zephon_torch.titan import ZephonTextDataLoader

    config = ConfigManager().parse_args(zephon_args(corpus, tokenizer_path, "/nonexistent", dp=2, steps=3,
                                                    interval=3) + ["--dataloader.packing", "first_fit"])
    dl_cfg = config.dataloader
    assert type(dl_cfg) is ZephonTextDataLoader.Config
    assert (dl_cfg.weights, dl_cfg.canonical_replicas, dl_cfg.packing) == ([0.7, 0.3], 4, "first_fit")
    assert config.model_spec.flavor == "debugmodel" and config.training.seq_len == 64
    loader = dl_cfg.build(dp_world_size=2, dp_rank=1, tokenizer=HuggingFaceTokenizer(
        tokenizer_path=os.path.dirname(tokenizer_path)), seq_len=64, local_batch_size=4, snapshot_every_n_steps=3)
    assert loader.dataset.plan.canonical_replicas == 4 and loader.dp_rank == 1
    packs = [op for op in loader.dataset.plan.ops if op.name == "pack"]
    assert [(p.method, p.max_length) for p in packs] == [("first_fit", 65)]
    inputs, labels = next(iter(loader))
    assert tuple(inputs["input"].shape) == tuple(labels.shape) == (4, 64)


@pytest.mark.contract("torchtitan.trainer.config")
def test_torchtitan_config_refuses_weights_and_schedule_together(corpus, tokenizer_path, tmp_path):
    from zephon_torch.titan import ZephonTextDataLoader

    sched = tmp_path / "mix.json"
    sched.write_text('{"weights": [{"step": {"0": 1.0, "3": 0.0}}, 1.0]}')
    both = ZephonTextDataLoader.Config(dataset_path=f"{corpus['docs_jsonl']},{corpus['code_jsonl']}",
                                       weights=[0.5, 0.5], schedule=str(sched), canonical_replicas=4)
    with pytest.raises(ValueError, match="schedule or weights"):
        both.build(dp_world_size=1, dp_rank=0, tokenizer=tokenizer_path, seq_len=64, local_batch_size=4)
    one = ZephonTextDataLoader.Config(dataset_path=corpus["docs_jsonl"], schedule=str(sched), canonical_replicas=4)
    with pytest.raises(ValueError, match="a schedule of 2 datasets for 1 inputs"):
        one.build(dp_world_size=1, dp_rank=0, tokenizer=tokenizer_path, seq_len=64, local_batch_size=4)


@pytest.mark.contract("torchtitan.trainer.elastic")
def test_torchtitan_trainer_resumes_zephon_at_another_dp(corpus, tokenizer_path, tmp_path):
    """The default suite's variant: 2 ranks train 4 steps (TorchTitan checkpoints at step 2); 1 rank
    resumes from that checkpoint through TorchTitan's load path and trains steps 3-4 on the same batches."""
    tmp = str(tmp_path)
    full_dump = os.path.join(tmp, "full")
    _, full, _ = run(tmp, "full", 2, zephon_args(corpus, tokenizer_path, full_dump, dp=2, steps=4, interval=2))
    assert sorted(full) == [1, 2, 3, 4] and len({tuple(b) for b in full.values()}) == 4
    assert dcp_keys(full_dump, 2) == rank_keys(2)
    dump = resume_dump(tmp, "resume-1", full_dump, 2)
    _, resumed, _ = run(tmp, "resume-1", 1, zephon_args(corpus, tokenizer_path, dump, dp=1, steps=4, interval=100))
    check_resume(full, resumed, 2, 4, "2 -> 1")


@pytest.mark.slow
@pytest.mark.contract("torchtitan.trainer.elastic")
def test_torchtitan_trainer_resume_table_4_to_2_and_2_to_4(corpus, tokenizer_path, tmp_path):
    """The resume table of docs/distributed.md: TorchTitan checkpoints at step 3 on 4 (2) ranks and resumes
    on 2 (4). Zephon's loader: steps 4-6 equal the uninterrupted run's global batches. TorchTitan's own
    loader, same Trainer and commands: its load fails (``REFUSALS``) and the run stops."""
    tmp, k, n = str(tmp_path), 3, 6
    z = lambda dump, dp, steps, interval: zephon_args(corpus, tokenizer_path, dump, dp=dp, steps=steps,  # noqa: E731
                                                      interval=interval)
    t = lambda dump, dp, steps, interval: titan_args(corpus, tokenizer_path, dump, dp=dp, steps=steps,  # noqa: E731
                                                     interval=interval)
    table = []
    _, full, _ = run(tmp, "zephon-full-dp2", 2, z(os.path.join(tmp, "zephon-full-dp2"), 2, n, k))
    assert sorted(full) == list(range(1, n + 1)) and len({tuple(b) for b in full.values()}) == n
    _, head4, _ = run(tmp, "zephon-head-dp4", 4, z(os.path.join(tmp, "zephon-head-dp4"), 4, k, k))
    assert all(head4[s] == full[s] for s in range(1, k + 1)), "4 ranks fresh differ from 2 ranks fresh"
    saved = {4: os.path.join(tmp, "zephon-head-dp4"), 2: os.path.join(tmp, "zephon-full-dp2")}
    for src, dst in ((4, 2), (2, 4)):
        assert dcp_keys(saved[src], k) == rank_keys(src)
        dump = resume_dump(tmp, f"zephon-{src}to{dst}", saved[src], k)
        _, resumed, _ = run(tmp, f"zephon-{src}to{dst}", dst, z(dump, dst, n, 100))
        table.append(("zephon", src, dst, f"resumed: steps {k + 1}-{n} equal the uninterrupted run's "
                      f"({check_resume(full, resumed, k, n, f'{src} -> {dst}')} of {n - k})"))
    # checkpoint.exclude_from_loading=["dataloader"]: TorchTitan restores the model but not the loader, which
    # starts fresh: steps k+1..n train on the uninterrupted run's steps 1..n-k.
    dump = resume_dump(tmp, "zephon-4to2-exclude", saved[4], k)
    _, fresh, _ = run(tmp, "zephon-4to2-exclude", 2, z(dump, 2, n, 100) + ["--checkpoint.exclude_from_loading",
                                                                           "dataloader"])
    assert sorted(fresh) == list(range(k + 1, n + 1)) and all(fresh[k + s] == full[s] for s in range(1, n - k + 1))
    table.append(("zephon, exclude_from_loading dataloader", 4, 2, "loader starts fresh: steps 4-6 = steps 1-3"))
    for src, dst in ((4, 2), (2, 4)):
        save = os.path.join(tmp, f"titan-head-dp{src}")
        _, head, _ = run(tmp, f"titan-head-dp{src}", src, t(save, src, k, k))
        assert sorted(head) == list(range(1, k + 1))
        assert dcp_keys(save, k) == rank_keys(src)
        dump = resume_dump(tmp, f"titan-{src}to{dst}", save, k)
        rc, resumed, log = run(tmp, f"titan-{src}to{dst}", dst, t(dump, dst, n, 100), expect_ok=False)
        with open(log, errors="replace") as fh:
            refused = REFUSALS[src, dst] in fh.read()
        assert rc != 0 and refused and not resumed, f"TorchTitan's loader did not refuse {src} -> {dst}\n{tail(log)}"
        table.append(("titan", src, dst, f"refused: torchrun exit {rc}, '{REFUSALS[src, dst]}', no step trained"))
    print("\n".join(f"| {a} | {b} -> {c} | {d} |" for a, b, c, d in table))
