"""``python -m benchmarks --only titan``: the loss-curve experiment through TorchTitan's own Trainer, on CPU.

TorchTitan's llama3 debug model trained by its Trainer (torchrun, gloo, benchmarks/titan/cpu.py) on the
demo corpus (``zephon.demo_corpus``, a 2,048-token BPE: the debug model's vocabulary) through
``zephon_torch.titan_config``: 4 ranks checkpoint at step ``--checkpoint-step`` and 1 and 2 ranks resume
from it; 1 and 2 ranks also train from scratch. Sized for 2 cores within about 20 minutes. Prints and
writes ``elastic``'s report (global batches equal to the 4-rank run's, loss differences, from-scratch
spread) under ``<workdir>/titan-curves/``; docs/loss-curves.md quotes it.
"""
from __future__ import annotations

import argparse
import os
import shutil

VOCAB = 2048  # TorchTitan's llama3 debugmodel vocabulary


def main(argv=None) -> int:
    """Build the data (cached), then run ``elastic.main`` with the CPU shape; its exit status."""
    from zephon.demo_corpus import build_corpus, build_tokenizer, default_workdir

    from . import elastic

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--workdir", default=None, help="demo workdir (corpus and tokenizer cache)")
    p.add_argument("--quick", action="store_true", help="10 steps, checkpoint at 5")
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--checkpoint-step", type=int, default=20)
    args = p.parse_args(argv)
    workdir = args.workdir or default_workdir()
    steps, ckpt = (10, 5) if args.quick else (args.steps, args.checkpoint_step)
    dirs = build_corpus(workdir)
    inputs = [dirs["source_jsonl"], dirs["docstrings_jsonl"]]
    assets = os.path.join(workdir, "titan-curves", "assets")
    os.makedirs(assets, exist_ok=True)  # TorchTitan reads <hf_assets_path>/tokenizer.json
    shutil.copyfile(build_tokenizer(workdir, inputs, vocab_size=VOCAB), os.path.join(assets, "tokenizer.json"))
    out = os.path.join(workdir, "titan-curves", f"run-{steps}-{ckpt}")
    shutil.rmtree(out, ignore_errors=True)
    return elastic.main(["--dataset-path", ",".join(inputs), "--weights", "0.5", "0.5", "--hf-assets-path", assets,
                         "--gpus", "0", "--save-dp", "4", "--resume-dp", "1", "2", "--scratch-dp", "1", "2",
                         "--checkpoint-step", str(ckpt), "--steps", str(steps), "--global-batch", "8",
                         "--seq-len", "128", "--canonical-replicas", "4", "--timeout", "1800", "--out", out])
