"""A small decoder-only language model in plain torch and its training step on one global batch.

The step takes the whole global batch (every simulated rank's rows, concatenated in rank order) in one
forward/backward, so the arithmetic depends on the rows and their order only: two runs whose loaders
deliver the same global batches compute bit-identical losses, whatever the number of ranks. Real DDP
computes the same mean gradient up to float rounding (``benchmarks.loss.ddp`` checks it).
"""
from __future__ import annotations

import copy
import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn


@dataclass(frozen=True)
class ModelConfig:
    """Sizes and optimiser settings.

    Args:
        vocab: vocabulary size (tokens).
        d_model: width; heads: attention heads; layers: transformer blocks.
        seq_len: tokens per row (learned positions up to this length).
        lr: peak AdamW learning rate; warmup: linear warm-up steps; steps: length of the cosine
            schedule (decays to lr / 10 at ``steps``); weight_decay; clip: gradient-norm clip.
        seed: parameter initialisation seed.
    """
    vocab: int = 1024
    d_model: int = 64
    heads: int = 4
    layers: int = 2
    seq_len: int = 64
    lr: float = 3e-3
    warmup: int = 10
    steps: int = 200
    weight_decay: float = 0.1
    clip: float = 1.0
    seed: int = 0


class Block(nn.Module):
    """Pre-norm transformer block: causal self-attention, then a GELU MLP (4x width)."""

    def __init__(self, d: int, heads: int):
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.fc, self.out = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, n, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(b, n, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(b, n, d)
        x = x + self.proj(a)
        return x + self.out(F.gelu(self.fc(self.ln2(x))))


class TinyLM(nn.Module):
    """Decoder-only LM with tied input/output embeddings and learned absolute positions.

    Args:
        cfg: ``ModelConfig``.
    ``forward(tokens)``: int64 ``[batch, seq]`` -> logits float32 ``[batch, seq, vocab]``."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.emb = nn.Embedding(cfg.vocab, cfg.d_model)
        self.pos = nn.Embedding(cfg.seq_len, cfg.d_model)
        self.blocks = nn.ModuleList(Block(cfg.d_model, cfg.heads) for _ in range(cfg.layers))
        self.ln = nn.LayerNorm(cfg.d_model)
        nn.init.normal_(self.emb.weight, std=0.02)
        nn.init.normal_(self.pos.weight, std=0.02)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        h = self.emb(tokens) + self.pos.weight[:tokens.shape[1]]
        for blk in self.blocks:
            h = blk(h)
        return self.ln(h) @ self.emb.weight.T


def setup_torch() -> None:
    """One thread and deterministic kernels: the same inputs give the same bits on every run."""
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)


def n_params(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def lr_at(cfg: ModelConfig, step: int) -> float:
    """Learning rate of ``step`` (0-based): linear warm-up, then cosine to lr / 10 at ``cfg.steps``."""
    if step < cfg.warmup:
        return cfg.lr * (step + 1) / cfg.warmup
    t = min(1.0, (step - cfg.warmup) / max(1, cfg.steps - cfg.warmup))
    return cfg.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * t)))


def token_loss(model: nn.Module, inputs: torch.Tensor, targets: torch.Tensor) -> tuple[torch.Tensor, int]:
    """Summed next-token cross-entropy and the number of scored tokens.

    Args:
        inputs: int64 ``[rows, seq]`` token ids.
        targets: int64 ``[rows, seq]``: the token to predict at each position, -100 where nothing is scored.
    Returns (sum of losses in nats, a 0-d float32 tensor; scored token count)."""
    logits = model(inputs)
    loss = F.cross_entropy(logits.flatten(0, 1), targets.flatten(), ignore_index=-100, reduction="sum")
    return loss, int((targets != -100).sum())


class Trainer:
    """Model + AdamW + schedule; ``step`` trains on one global batch.

    Args:
        cfg: ``ModelConfig``.
    """

    def __init__(self, cfg: ModelConfig):
        torch.manual_seed(cfg.seed)
        self.cfg = cfg
        self.model = TinyLM(cfg)
        decay = [p for n, p in self.model.named_parameters() if p.dim() >= 2 and "pos" not in n]
        rest = [p for n, p in self.model.named_parameters() if not (p.dim() >= 2 and "pos" not in n)]
        self.opt = torch.optim.AdamW([{"params": decay, "weight_decay": cfg.weight_decay},
                                      {"params": rest, "weight_decay": 0.0}], lr=cfg.lr, betas=(0.9, 0.95))

    def step(self, inputs: torch.Tensor, targets: torch.Tensor, step: int) -> float:
        """One optimiser step on the global batch; returns its mean training loss (nats per token).

        Args:
            inputs, targets: int64 ``[global rows, seq]`` (see ``token_loss``), rows in global-batch order.
            step: global step index (0-based), for the learning rate.
        """
        for g in self.opt.param_groups:
            g["lr"] = lr_at(self.cfg, step)
        self.model.train()
        loss_sum, count = token_loss(self.model, inputs, targets)
        loss = loss_sum / max(count, 1)
        self.opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.cfg.clip)
        self.opt.step()
        return float(loss.detach())

    @torch.no_grad()
    def evaluate(self, inputs: torch.Tensor, targets: torch.Tensor, chunk: int = 64) -> float:
        """Mean next-token loss (nats per token) on held-out rows ``[rows, seq]``, in fixed chunks of rows."""
        self.model.eval()
        total, count = 0.0, 0
        for i in range(0, len(inputs), chunk):
            s, c = token_loss(self.model, inputs[i:i + chunk], targets[i:i + chunk])
            total, count = total + float(s), count + c
        return total / max(count, 1)

    def snapshot(self) -> dict:
        """Model and optimiser state (deep copies): what a training checkpoint holds."""
        return {"model": copy.deepcopy(self.model.state_dict()), "opt": copy.deepcopy(self.opt.state_dict())}

    def load(self, snap: dict) -> None:
        self.model.load_state_dict(snap["model"])
        self.opt.load_state_dict(copy.deepcopy(snap["opt"]))
