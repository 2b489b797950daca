#!/usr/bin/env python
"""A tiny GPT ``pretrain()`` of Megatron-LM on zephon_energon, checked across a resume (needs one GPU).

    python scripts/megatron_gpt_resume.py [--workdir DIR] [--python PY] [--dry-run]

Steps (``--dry-run`` prints their commands and stops):
1. 64 text samples in 4 tars, prepared by the real ``energon prepare`` (train = 3 tars, val = 1).
2. Run A: ``torchrun --nproc-per-node 1`` (dp 1) of a 2-layer GPT (``--transformer-impl local``, no apex or
   Transformer Engine needed) for 20 iterations, ``--dataloader-type external``, checkpoint (model and, through
   ``--dataloader-save``, the data loader state) at iteration 10.
3. Run B: the same command with ``--load`` and ``--ckpt-step 10`` (run A also saved at 20): resumes at
   iteration 10 and runs to 20.
4. Check: the sample keys of run B's iterations 11-20 equal run A's (written by the forward step of each run).
Exit status 0 when they are equal. The run itself is Megatron-LM's ``pretrain`` as ``pretrain_gpt.py`` calls it,
with ``megatron.energon`` swapped for zephon_energon and zephon_energon.megatron's data loader provider.
Requires megatron-core >= 0.19 (with ``megatron.training``), megatron-energon, webdataset and this package
(``pip install -e '.[energon]' megatron-core``). See docs/energon.md.
"""
from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys

ITERS, SAVE_AT = 20, 10
GPT = ["--num-layers", "2", "--hidden-size", "64", "--num-attention-heads", "4", "--seq-length", "64",
       "--max-position-embeddings", "64", "--tokenizer-type", "NullTokenizer", "--vocab-size", "256",
       "--micro-batch-size", "2", "--global-batch-size", "2", "--lr", "1e-4", "--train-iters", str(ITERS),
       "--transformer-impl", "local", "--no-gradient-accumulation-fusion", "--no-masked-softmax-fusion",
       "--no-bias-gelu-fusion", "--no-bias-dropout-fusion", "--no-rope-fusion", "--no-persist-layer-norm",
       "--eval-iters", "0", "--eval-interval", "1000", "--log-interval", "1", "--ckpt-format", "torch"]


def commands(workdir: str, python: str) -> dict:
    """The commands of the check, by step: ``prepare`` (list of argv), ``run_a`` / ``run_b`` (argv).

    workdir: where the data, checkpoints and key logs go. python: the interpreter that has megatron-core."""
    data, ckpt = os.path.join(workdir, "data"), os.path.join(workdir, "ckpt")
    energon = os.path.join(os.path.dirname(python), "energon")
    prepare = [energon, "prepare", "--non-interactive", "--no-progress", "--num-workers", "1", "--sample-type",
               "TextSample", "--field-map", json.dumps({"text": "txt"}), "--split-parts", r"train:text-00[0-2]\.tar",
               "--split-parts", r"val:text-003\.tar", data]

    def run(name, load):
        return ([python, "-m", "torch.distributed.run", "--nproc-per-node", "1", os.path.abspath(__file__), "--train",
                 "--keys-log", os.path.join(workdir, f"keys-{name}.jsonl")] + GPT +
                ["--dataloader-type", "external", "--num-workers", "1", "--data-path", data, "--save", ckpt,
                 "--save-interval", str(SAVE_AT), "--dataloader-save", os.path.join(ckpt, "dataloader"),
                 "--canonical-replicas", "8"] + (["--load", ckpt, "--ckpt-step", str(SAVE_AT)] if load else []))
    return {"prepare": prepare, "run_a": run("a", False), "run_b": run("b", True)}


def write_tars(data: str) -> None:
    """64 TextSamples ``gpt0000``..``gpt0063`` (``.txt``), 16 per tar ``text-NNN.tar``."""
    import webdataset as wds

    os.makedirs(data, exist_ok=True)
    with wds.ShardWriter(os.path.join(data, "text-%03d.tar"), maxcount=16, verbose=0) as w:
        for i in range(64):
            w.write({"__key__": f"gpt{i:04d}", "txt": f"sample {i}: " + "the quick brown fox " * (i % 5 + 1)})


# ---------------------------------------------------------------------------------------- inside torchrun
def _extra_args(parser):
    g = parser.add_argument_group(title="zephon check")
    g.add_argument("--dataloader-save", type=str, default=None, help="Energon dataloader state save path")
    g.add_argument("--canonical-replicas", type=int, default=None)
    g.add_argument("--keys-log", type=str, required=True, help="JSON lines: the sample keys of every iteration")
    return parser


def _forward_step(data_iterator, model):
    """GPT forward on one TextSample batch: bytes of the text as tokens (vocab 256), next-byte labels; the
    batch's sample keys appended to --keys-log."""
    from functools import partial

    import torch
    from megatron.training import get_args

    args = get_args()
    batch = next(data_iterator)
    with open(args.keys_log, "a") as fh:
        fh.write(json.dumps(list(batch.__key__)) + "\n")
    s = args.seq_length
    rows = [list(t.encode()[:s + 1].ljust(s + 1, b" ")) for t in batch.text]
    ids = torch.tensor(rows, dtype=torch.long, device="cuda")
    tokens, labels = ids[:, :-1].contiguous(), ids[:, 1:].contiguous()
    loss_mask = torch.ones_like(labels, dtype=torch.float)
    position_ids = torch.arange(s, device="cuda").unsqueeze(0).expand_as(tokens)
    attention_mask = torch.ones(1, 1, s, s, device="cuda").tril() < 0.5  # True = masked (Megatron's convention)
    output = model(tokens, position_ids, attention_mask, labels=labels)

    def loss_func(mask, out):
        losses = out.view(-1).float()
        mask = mask.view(-1)
        loss = torch.sum(losses * mask)
        n = mask.sum().clone().detach().to(torch.int)
        return loss, n, {"lm loss": torch.cat([loss.clone().detach().view(1), n.view(1)])}
    return output, partial(loss_func, loss_mask)


def train() -> None:
    """Megatron-LM's pretrain, as pretrain_gpt.py's main calls it, on zephon_energon's provider."""
    import zephon_energon

    sys.modules["megatron.energon"] = zephon_energon  # the swap (docs/energon.md)
    from megatron.core.enums import ModelType
    from megatron.training import pretrain
    from megatron.training.argument_utils import gpt_config_from_args, pretrain_cfg_container_from_args
    from megatron.training.arguments import parse_and_validate_args

    from zephon_energon.megatron import train_valid_test_dataloaders_provider as provider

    provider.is_distributed = True
    args = parse_and_validate_args(extra_args_provider=_extra_args)
    pretrain(pretrain_cfg_container_from_args(args, gpt_config_from_args(args)), provider,
             ModelType.encoder_or_decoder, _forward_step)


# ---------------------------------------------------------------------------------------- the check
def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[1])
    p.add_argument("--workdir", default="megatron_gpt_resume")
    p.add_argument("--python", default=sys.executable, help="interpreter with megatron-core and zephon_energon")
    p.add_argument("--dry-run", action="store_true", help="print the commands, run nothing")
    a = p.parse_args(argv)
    workdir = os.path.abspath(a.workdir)
    cmds = commands(workdir, a.python)
    if a.dry_run:
        print("# 1. write 64 text samples in 4 tars to", os.path.join(workdir, "data"), "then prepare them:")
        for step in ("prepare", "run_a", "run_b"):
            print(shlex.join(cmds[step]))
        print(f"# 4. compare {os.path.join(workdir, 'keys-b.jsonl')} with iterations {SAVE_AT + 1}-{ITERS} of "
              f"{os.path.join(workdir, 'keys-a.jsonl')}")
        return 0
    if os.path.exists(workdir):
        raise SystemExit(f"{workdir} exists: give a new --workdir")
    write_tars(os.path.join(workdir, "data"))
    for step in ("prepare", "run_a", "run_b"):
        print("$", shlex.join(cmds[step]), flush=True)
        subprocess.run(cmds[step], check=True)
    logs = {}
    for name in "ab":
        with open(os.path.join(workdir, f"keys-{name}.jsonl")) as fh:
            logs[name] = [json.loads(line) for line in fh]
    want, got = logs["a"][SAVE_AT:], logs["b"]
    if len(logs["a"]) != ITERS or got != want:
        print(f"FAIL: run A logged {len(logs['a'])} iterations; resumed iterations {SAVE_AT + 1}-{ITERS} differ:\n"
              f"  A: {want}\n  B: {got}")
        return 1
    print(f"OK: iterations {SAVE_AT + 1}-{ITERS} after the resume at {SAVE_AT} saw the same samples as the "
          f"uninterrupted run ({len(got)} micro-batches)")
    return 0


if __name__ == "__main__":
    if "--train" in sys.argv:
        sys.argv.remove("--train")
        train()
    else:
        sys.exit(main())
