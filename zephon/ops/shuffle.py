"""Shuffle buffer (a per-lane accumulator) whose choices are seeded by element identity.

Which buffered element leaves when a new one arrives is ``hash(seed, identity of the arriving
element) % buffer_size``. No RNG state exists, so the output is a pure function of the input order:
nothing to checkpoint, and a replay from the last flush reproduces it exactly.
"""
from __future__ import annotations

import numpy as np

from ..work.permute import derive_key, mix64
from .base import Accumulator, Operator
from ..formats.records import first_piece


def identity(record: dict) -> int:
    """A record's element identity as an int: the global stream position of its (first) source sample
    and the piece number. Rows built from several documents use their first document."""
    position, piece = first_piece(record)
    return (position << 16) + piece


class Shuffle(Operator):
    """Accumulator operator: a shuffle buffer of ``buffer_size`` records, keyed by ``seed``.

    Memory: ``buffer_size`` records per lane. A flush (sentinel or end of lane) drains the buffer in an
    order also given by the identity hash."""

    name = "shuffle"
    reorders_only = True

    def __init__(self, buffer_size: int = 1024, seed: int = 0):
        if buffer_size < 1:
            raise ValueError(f"shuffle buffer_size must be >= 1, got {buffer_size}")
        self.buffer_size, self.seed = buffer_size, seed
        self.key = np.uint64(derive_key("shuffle", seed))

    def fingerprint(self) -> dict:
        return {"op": self.name, "buffer_size": self.buffer_size, "seed": self.seed}

    def new_accumulator(self, lane: int) -> "ShuffleAccumulator":
        return ShuffleAccumulator(self, lane)


class ShuffleAccumulator(Accumulator):
    def __init__(self, op: Shuffle, lane: int):
        self.size = op.buffer_size
        self.key = mix64(np.array([op.key ^ np.uint64(lane)], dtype=np.uint64))[0]
        self.buffer: list[dict] = []

    def _hash(self, record: dict) -> int:
        return int(mix64(np.array([identity(record)], dtype=np.uint64) ^ self.key)[0])

    def push(self, record: dict) -> list[dict]:
        if len(self.buffer) < self.size:
            self.buffer.append(record)
            return []
        j = self._hash(record) % self.size
        out, self.buffer[j] = self.buffer[j], record
        return [out]

    def flush(self) -> list[dict]:
        buf, self.buffer = self.buffer, []
        if not buf:
            return []
        keys = mix64(np.array([identity(r) for r in buf], dtype=np.uint64) ^ self.key)
        return [buf[i] for i in np.argsort(keys, kind="stable")]
