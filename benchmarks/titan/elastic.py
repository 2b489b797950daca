"""The launch experiment through TorchTitan's own Trainer: checkpoint at step 150 on 16 ranks, resume on 8,
32 and 64, compare every global batch (SHA-256) with the uninterrupted run's.

``python -m benchmarks.titan.elastic --dataset-path DATA --hf-assets-path TOKENIZER_DIR [--dry-run]``
(scripts/titan_elastic.sh). The first run (16 ranks, ``--steps`` steps, TorchTitan checkpointing every
``--checkpoint-step`` steps) is both the reference and the checkpoint; each resume copies its step-150
checkpoint into a fresh dump folder, so TorchTitan's own ``CheckpointManager.load`` restores it.

A run of D ranks uses D GPUs (NCCL, one process per GPU) when the machine has them; with fewer GPUs its
ranks are simulated as D CPU processes over gloo (``launch.torchrun(cpu=True)``: benchmarks/titan/cpu.py),
still real torch.distributed ranks with their own dp_rank. ``--dry-run`` prints the plan, parses every
run's TorchTitan config with TorchTitan's ConfigManager and builds rank 0's data loader at every dp degree
(a dp degree that does not fit ``canonical_replicas`` or the global batch fails here), then stops.
``--scratch-dp``: from-scratch runs at more dp degrees (the loss curves' spread across rank counts).
Output: ``OUT/report.md`` (one row per resume or from-scratch run: global batches equal to the
uninterrupted run's, largest loss difference) and ``OUT/report.json`` (per-step digests and losses).
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
from dataclasses import asdict, dataclass, field

from .launch import global_batches, losses, tail, torchrun


@dataclass
class Run:
    """One TorchTitan launch of the experiment."""
    name: str
    dp: int
    device: str  # "gpu" (one process per GPU) or "cpu" (simulated ranks: gloo)
    steps: int
    interval: int  # TorchTitan's checkpoint.interval
    load: str | None = None  # the run whose checkpoint of ``load_step`` this one resumes from
    load_step: int = 0
    args: list = field(default_factory=list)


def parse(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--dataset-path", required=True, help="Zephon inputs, comma-separated (JSONL/Parquet/MDS)")
    p.add_argument("--weights", type=float, nargs="*", default=[], help="mixture weights, one per input")
    p.add_argument("--hf-assets-path", required=True, help="directory with tokenizer.json (TorchTitan's)")
    p.add_argument("--config", default="zephon_llama3_debugmodel",
                   help="function of zephon_torch.titan_config (zephon_llama3_1b: the launch report's size)")
    p.add_argument("--save-dp", type=int, default=16)
    p.add_argument("--resume-dp", type=int, nargs="+", default=[8, 32, 64])
    p.add_argument("--scratch-dp", type=int, nargs="*", default=[],
                   help="from-scratch runs at these dp degrees too (the loss curves' spread across rank counts)")
    p.add_argument("--checkpoint-step", type=int, default=150)
    p.add_argument("--steps", type=int, default=200, help="last step of every run")
    p.add_argument("--global-batch", type=int, default=64, help="rows per step (a multiple of every dp)")
    p.add_argument("--seq-len", type=int, default=2048)
    p.add_argument("--canonical-replicas", type=int, default=64)
    p.add_argument("--seed", type=int, default=0, help="TorchTitan's --debug.seed: the same initial model in every run")
    p.add_argument("--gpus", type=int, default=None, help="GPUs to use (default: all visible)")
    p.add_argument("--out", default="titan-elastic-out")
    p.add_argument("--timeout", type=float, default=4 * 3600, help="seconds per run")
    p.add_argument("--dry-run", action="store_true", help="plan and validate, train nothing")
    p.add_argument("extra", nargs="*", help="more TorchTitan arguments, after --")
    return p.parse_args(argv)


def plan(opts, gpus: int) -> list[Run]:
    """The runs, in order. Raises ``ValueError`` for a dp degree that does not divide the global batch or a
    checkpoint step past the last step."""
    dps = [opts.save_dp, *opts.resume_dp, *opts.scratch_dp]
    bad = [d for d in dps if opts.global_batch % d]
    if bad:
        raise ValueError(f"--global-batch {opts.global_batch} is not a multiple of dp {bad}")
    if not 0 < opts.checkpoint_step < opts.steps:
        raise ValueError(f"--checkpoint-step {opts.checkpoint_step} must fall inside 1..{opts.steps - 1}")
    device = lambda dp: "gpu" if dp <= gpus else "cpu"  # noqa: E731
    full = Run(f"full-dp{opts.save_dp}", opts.save_dp, device(opts.save_dp), opts.steps, opts.checkpoint_step)
    runs = [full] + [Run(f"resume-dp{d}", d, device(d), opts.steps, opts.steps, load=full.name,
                         load_step=opts.checkpoint_step) for d in opts.resume_dp]
    runs += [Run(f"scratch-dp{d}", d, device(d), opts.steps, opts.steps) for d in opts.scratch_dp]
    for r in runs:
        r.args = titan_args(opts, r)
    return runs


def titan_args(opts, run: Run) -> list[str]:
    """TorchTitan's command line for ``run``."""
    weights = ["--dataloader.weights", *map(str, opts.weights)] if opts.weights else []
    return ["--module", "zephon_torch.titan_config", "--config", opts.config, "--hf_assets_path", opts.hf_assets_path,
            "--dataloader.dataset_path", opts.dataset_path, *weights,
            "--dataloader.canonical_replicas", str(opts.canonical_replicas),
            "--training.seq_len", str(opts.seq_len), "--training.local_batch_size", str(opts.global_batch // run.dp),
            "--training.steps", str(run.steps), "--dump_folder", os.path.join(os.path.abspath(opts.out), run.name),
            "--checkpoint.enable", "--checkpoint.interval", str(run.interval), "--debug.seed", str(opts.seed),
            *opts.extra]


def dry_run(opts, runs: list[Run]) -> list[str]:
    """Parse each run's config with TorchTitan's ConfigManager and build its rank 0 data loader (first batch
    drawn); returns one line per run. Raises what TorchTitan or Zephon raise for a bad run."""
    from torchtitan.components.tokenizer import HuggingFaceTokenizer
    from torchtitan.config import ConfigManager

    tokenizer = HuggingFaceTokenizer(tokenizer_path=opts.hf_assets_path)
    lines = []
    for r in runs:
        config = ConfigManager().parse_args(list(r.args))
        loader = config.dataloader.build(dp_world_size=r.dp, dp_rank=0, tokenizer=tokenizer,
                                         seq_len=config.training.seq_len,
                                         local_batch_size=config.training.local_batch_size,
                                         snapshot_every_n_steps=r.interval)
        inputs, _ = next(iter(loader))
        lanes = loader.dataset.plan.rank_lanes
        src = f", resumes {r.load} step {r.load_step}" if r.load else ""
        lines.append(f"{r.name}: {r.dp} ranks on {r.device}, steps 1-{r.steps}{src}; rank 0 batch "
                     f"{list(inputs['input'].shape)}, lanes {lanes[0]}-{lanes[-1]} of "
                     f"{loader.dataset.plan.canonical_replicas}; {type(loader).__name__}")
    return lines


def batch_digest(rows: list[str]) -> str:
    """SHA-256 of one global batch from its row digests (dp ranks ascending)."""
    return hashlib.sha256("".join(rows).encode()).hexdigest()


def execute(opts, runs: list[Run]) -> dict:
    """Launch every run, then compare each resume's steps with the full run's; returns the report."""
    out = os.path.abspath(opts.out)
    batches, loss = {}, {}
    os.makedirs(out, exist_ok=True)
    for r in runs:
        dump = os.path.join(out, r.name)
        if r.load:
            ckpt = f"step-{r.load_step}"
            shutil.copytree(os.path.join(out, r.load, "checkpoint", ckpt), os.path.join(dump, "checkpoint", ckpt))
        log, digests = os.path.join(out, f"{r.name}.log"), os.path.join(out, f"{r.name}-digests")
        rc = torchrun(r.dp, r.args, digests=digests, cpu=r.device == "cpu", log=log, timeout=opts.timeout)
        if rc:
            raise RuntimeError(f"{r.name}: torchrun exited {rc} (log {log})\n{tail(log)}")
        batches[r.name], loss[r.name] = global_batches(digests), losses(digests)
    full, full_loss = batches[runs[0].name], loss[runs[0].name]
    report = {"runs": [asdict(r) for r in runs], "full": {s: batch_digest(b) for s, b in full.items()},
              "full_loss": full_loss, "resumes": {}}
    for r in runs[1:]:
        got = batches[r.name]
        same = [s for s in got if got[s] == full.get(s)]
        report["resumes"][r.name] = {
            "dp": r.dp, "device": r.device, "kind": "resume" if r.load else "from scratch", "steps": sorted(got),
            "identical": len(same), "digests": {s: batch_digest(b) for s, b in got.items()}, "loss": loss[r.name],
            "max_loss_diff": max(abs(v - full_loss[s]) for s, v in loss[r.name].items())}
    scratch = [loss[r.name] for r in runs if not r.load]
    report["scratch_spread"] = max(max(c[s] for c in scratch) - min(c[s] for c in scratch) for s in full_loss)
    return report


def write_report(opts, report: dict) -> str:
    """``OUT/report.json`` and ``OUT/report.md``; returns the markdown."""
    full = report["runs"][0]
    lines = [f"Checkpoint at step {opts.checkpoint_step} on {full['dp']} ranks ({full['device']}), "
             f"steps to {opts.steps}, global batch {opts.global_batch} x {opts.seq_len} tokens, "
             f"config {opts.config}.", "",
             "| run | ranks | device | steps | global batches equal to the uninterrupted run's | max abs loss diff |",
             "| --- | --- | --- | --- | --- | --- |"]
    for r in report["resumes"].values():
        lines.append(f"| {r['kind']} | {r['dp']} | {r['device']} | {r['steps'][0]}-{r['steps'][-1]} | "
                     f"{r['identical']}/{len(r['steps'])} | {r['max_loss_diff']:.2e} |")
    dps = [full["dp"]] + [r["dp"] for r in report["resumes"].values() if r["kind"] != "resume"]
    lines += ["", f"Loss spread of the from-scratch runs on {', '.join(map(str, dps))} ranks (max over steps of "
              f"max - min): {report['scratch_spread']:.2e}."]
    md = "\n".join(lines) + "\n"
    os.makedirs(opts.out, exist_ok=True)
    with open(os.path.join(opts.out, "report.json"), "w") as fh:
        json.dump(report, fh, indent=1)
    with open(os.path.join(opts.out, "report.md"), "w") as fh:
        fh.write(md)
    return md


def main(argv=None) -> int:
    """Plan, then dry-run or execute; exit status 1 when a resumed global batch differs."""
    opts = parse(argv)
    gpus = opts.gpus
    if gpus is None:
        import torch

        gpus = torch.cuda.device_count()
    runs = plan(opts, gpus)
    if opts.dry_run:
        print("\n".join(dry_run(opts, runs)))
        return 0
    report = execute(opts, runs)
    print(write_report(opts, report))
    return 0 if all(r["identical"] == len(r["steps"]) for r in report["resumes"].values()) else 1


if __name__ == "__main__":
    raise SystemExit(main())
