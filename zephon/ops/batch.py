"""Batching rows into micro-batches.

The engine groups each lane's rows: a global step takes ``global_batch_size / canonical_replicas``
rows from every lane, split into micro-batches of ``micro_batch_size`` rows (gradient accumulation
covers the rest), so the micro-batch size may change between runs without changing a global batch.
"""
from __future__ import annotations

import numpy as np

from .base import Operator


class Batch(Operator):
    """Terminal operator: ``micro_batch_size`` rows per micro-batch; ``drop_last`` drops (and counts) a
    lane's final incomplete step at the end of a finite stream instead of yielding a short one.
    ``micro_batch_size`` is a runtime knob (not in the checkpoint identity); ``drop_last`` is."""

    name = "batch"

    def __init__(self, micro_batch_size: int = 1, drop_last: bool = True):
        if micro_batch_size < 1:
            raise ValueError(f"micro_batch_size must be >= 1, got {micro_batch_size}")
        self.micro_batch_size, self.drop_last = micro_batch_size, drop_last

    def fingerprint(self) -> dict:
        return {"op": self.name, "drop_last": self.drop_last}


def collate(rows: list[dict]) -> dict:
    """Stack rows into a micro-batch: numpy arrays of equal shape become ``[rows, ...]`` arrays; other
    values (``cu_seqlens`` of varying length, ``__src__``, numbers) become lists of length ``rows``."""
    out = {}
    for k in rows[0]:
        vals = [r[k] for r in rows]
        v0 = vals[0]
        if isinstance(v0, np.ndarray) and all(isinstance(v, np.ndarray) and v.shape == v0.shape for v in vals):
            out[k] = np.stack(vals)
        else:
            out[k] = vals
    return out
