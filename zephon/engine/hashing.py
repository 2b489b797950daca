"""SHA-256 of global batches, independent of how rows were cut into micro-batches or ranks.

A row's digest covers every non-metadata field (numpy bytes with dtype and shape, other values by
repr). A global batch's digest is SHA-256 over its rows' digests in (lane, row) order.
"""
from __future__ import annotations

import hashlib
from collections import defaultdict

import numpy as np


def row_digests(micro_batch: dict) -> list[bytes]:
    """One 32-byte digest per row of a micro-batch (dict from ``Loader``)."""
    keys = sorted(k for k in micro_batch if not k.startswith("__"))
    n = len(micro_batch[keys[0]])
    out = []
    for i in range(n):
        h = hashlib.sha256()
        for k in keys:
            v = micro_batch[k][i]
            h.update(k.encode())
            if isinstance(v, np.ndarray):
                h.update(f"{v.dtype.str}{v.shape}".encode())
                h.update(np.ascontiguousarray(v).tobytes())
            else:
                h.update(repr(v).encode())
        out.append(h.digest())
    return out


class GlobalBatchHasher:
    """Feed micro-batches from any ranks in any order; ``digests()`` gives ``{step: sha256 hex}``."""

    def __init__(self):
        self._rows = defaultdict(lambda: defaultdict(list))  # step -> lane -> [(micro, digests)]

    def add(self, micro_batch: dict) -> None:
        self._rows[micro_batch["__step__"]][micro_batch["__lane__"]].append(
            (micro_batch["__micro__"], row_digests(micro_batch)))

    def digests(self) -> dict[int, str]:
        out = {}
        for step in sorted(self._rows):
            h = hashlib.sha256()
            for lane in sorted(self._rows[step]):
                for _, ds in sorted(self._rows[step][lane], key=lambda x: x[0]):
                    for d in ds:
                        h.update(d)
            out[step] = h.hexdigest()
        return out
