"""One rank of TorchTitan's own ``torchtitan.train.main``, with every batch its Trainer receives logged.

``torchrun ... -m benchmarks.titan.train [--cpu] [--digests DIR] <torchtitan.train arguments>``

``--digests DIR``: ``Trainer.batch_generator`` (what feeds ``train_step``) is wrapped so each batch it
yields appends one line to ``DIR/rank{r}.jsonl``: ``{"step", "dp_rank", "dp", "rows": [sha256 of each row's
input, positions and labels as int64]}``. ``launch.global_batches`` joins the ranks' lines into global
batches. Rank 0 also appends ``{"step", "loss"}`` (TorchTitan's global average loss, as its metrics log it)
to ``DIR/loss.jsonl`` (``launch.losses``). ``--cpu``: ``cpu.patch_for_cpu()`` first (what TorchTitan
needs on a machine without GPUs).
Everything else (config parsing, Trainer, CheckpointManager, DCP) is TorchTitan's, unchanged.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys


def row_digests(input_dict, labels) -> list[str]:
    """SHA-256 per row of one batch: its ``input``, ``positions`` and ``labels`` ([B, seq_len]) as int64."""
    import torch

    parts = [input_dict["input"], input_dict.get("positions", torch.zeros_like(labels)), labels]
    return [hashlib.sha256(b"".join(t[i].to(torch.int64).numpy().tobytes() for t in parts)).hexdigest()
            for i in range(labels.shape[0])]


def log_batches(trainer_cls, out_dir: str) -> None:
    """Wrap ``trainer_cls.batch_generator`` so every batch it yields is logged to ``out_dir`` (see above)."""
    import torch.distributed as dist

    original = trainer_cls.batch_generator

    def batch_generator(self, data_iterable):
        rank = dist.get_rank() if dist.is_initialized() else 0
        dp_rank = getattr(self.dataloader, "dp_rank", rank)
        dp = getattr(self.dataloader, "dp_world_size", dist.get_world_size() if dist.is_initialized() else 1)
        with open(os.path.join(out_dir, f"rank{rank}.jsonl"), "a") as fh:
            for input_dict, labels in original(self, data_iterable):
                # self.step is already the step this batch trains (Trainer.train increments it first).
                fh.write(json.dumps({"step": self.step, "dp_rank": dp_rank, "dp": dp,
                                     "rows": row_digests(input_dict, labels)}) + "\n")
                fh.flush()
                yield input_dict, labels

    trainer_cls.batch_generator = batch_generator


def log_losses(metrics_cls, out_dir: str) -> None:
    """Wrap ``metrics_cls.log`` (TorchTitan's ``MetricsProcessor.log``) so rank 0 records each step's loss."""
    import torch.distributed as dist

    original = metrics_cls.log

    def log(self, step, global_avg_loss, *args, **kwargs):
        if not dist.is_initialized() or dist.get_rank() == 0:
            with open(os.path.join(out_dir, "loss.jsonl"), "a") as fh:
                fh.write(json.dumps({"step": step, "loss": float(global_avg_loss)}) + "\n")
        return original(self, step, global_avg_loss, *args, **kwargs)

    metrics_cls.log = log


def main(argv=None) -> None:
    """Parse our two options, apply them, then hand the rest of ``argv`` to ``torchtitan.train.main``."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cpu", action="store_true", help="patch TorchTitan for CPU + gloo (benchmarks/titan/cpu.py)")
    parser.add_argument("--digests", default=None, help="directory for per-rank batch digests")
    ours, rest = parser.parse_known_args(sys.argv[1:] if argv is None else argv)
    if ours.cpu:
        from .cpu import patch_for_cpu

        patch_for_cpu()
    if ours.digests:
        from torchtitan.components.metrics import MetricsProcessor
        from torchtitan.trainer import Trainer

        os.makedirs(ours.digests, exist_ok=True)
        log_batches(Trainer, ours.digests)
        log_losses(MetricsProcessor, ours.digests)
    import torchtitan.train

    sys.argv = [sys.argv[0], *rest]
    torchtitan.train.main()


if __name__ == "__main__":
    main()
