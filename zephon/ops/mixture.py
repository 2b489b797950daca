"""Token-level mixture correction.

The WorkSource mixes by samples. When datasets have different document lengths, sample proportions
are not token proportions. Two parts fix that, neither dropping a sample:
- ``token_corrected_weights``: sample weights ``w_d / mean_tokens_d`` from a seeded sample of each
  dataset, computed once from the data (deterministic), so the long-run token shares match;
- ``EnsureMixture``: a per-lane accumulator that reorders documents by token deficit so every stretch
  of the lane (and so every packed row and batch) stays close to the target token shares.
"""
from __future__ import annotations

import numpy as np

from ..formats import DataError
from .base import Accumulator, Operator, RecordError
from ..formats.records import SRC, Src, src_of


def token_corrected_weights(datasets, weights, token_counter, *, seed: int = 0, sample_size: int = 256) -> list[float]:
    """Sample weights whose expected token shares equal ``weights``.

    Args: ``datasets`` (objects with ``read(shard_id, indices)``, ``shard_sizes``), ``weights`` (target
    token shares), ``token_counter(records) -> list[int]`` (tokens per record, e.g. from ``Tokenize``).
    Reads ``sample_size`` samples per dataset at positions fixed by ``seed``. Returns floats."""
    from ..work.permute import IndexPermutation, derive_key

    out = []
    for d, (ds, w) in enumerate(zip(datasets, weights)):
        sizes = np.asarray(ds.shard_sizes, dtype=np.int64)
        n = int(sizes.sum())
        picks = IndexPermutation(n, derive_key(seed, "token-weights", d))(np.arange(min(n, sample_size)))
        ends = np.cumsum(sizes)
        shards = np.searchsorted(ends, picks, side="right")
        idx = picks - (ends - sizes)[shards]
        counts = []
        for s in np.unique(shards):
            sel = shards == s
            for i, r in zip(idx[sel].tolist(), ds.read(int(s), idx[sel].tolist())):
                if "__error__" in r:
                    continue  # a bad sample in skip mode: it will be skipped in training too
                r[SRC] = Src(d, int(s), i, -1)
                try:
                    counts.extend(token_counter([r]))
                except RecordError as e:
                    if getattr(ds, "on_error", "raise") != "skip":
                        shard = ds.shards[int(s)]
                        raise DataError(f"dataset {ds.name!r}: {e}", path=shard.path, shard=int(s),
                                        sample=i) from None
        mean = max(1e-9, float(np.mean(counts))) if counts else 1.0
        out.append(w / mean)
    total = sum(out)
    return [x / total for x in out]


class EnsureMixture(Operator):
    """Accumulator operator: release tokenized documents so each dataset's share of released tokens
    tracks ``weights``.

    Documents wait in one queue per dataset (by ``__src__[0]``); the next released is the head of the
    queue of the dataset furthest below its target share. When the most-behind dataset has nothing
    buffered the accumulator waits, unless ``buffer_size`` documents are held, then it releases from
    the most-behind dataset that has one. Flush releases everything in deficit order."""

    name = "ensure_mixture"
    reorders_only = True

    def __init__(self, weights, buffer_size: int = 256):
        total = float(sum(weights))
        self.weights = [float(w) / total for w in weights]
        self.buffer_size = buffer_size

    def fingerprint(self) -> dict:
        return {"op": self.name, "weights": self.weights, "buffer_size": self.buffer_size}

    def new_accumulator(self, lane: int) -> "MixtureAccumulator":
        return MixtureAccumulator(self)


class MixtureAccumulator(Accumulator):
    def __init__(self, op: EnsureMixture):
        self.w = op.weights
        self.cap = op.buffer_size
        self.queues = [[] for _ in self.w]
        self.released = [0] * len(self.w)
        self.held = 0

    def _order(self):
        total = sum(self.released) + 1
        # most behind first: smallest released / target share; ties by dataset id
        return sorted(range(len(self.w)), key=lambda d: (self.released[d] / (self.w[d] * total), d))

    def _release(self, d: int) -> dict:
        r = self.queues[d].pop(0)
        self.released[d] += r["num_tokens"]
        self.held -= 1
        return r

    def push(self, record: dict) -> list[dict]:
        self.queues[src_of(record).dataset].append(record)
        self.held += 1
        out = []
        while self.held:
            order = self._order()
            if self.queues[order[0]]:
                out.append(self._release(order[0]))
            elif self.held >= self.cap:
                out.append(self._release(next(d for d in order if self.queues[d])))
            else:
                break
        return out

    def flush(self) -> list[dict]:
        out = []
        while self.held:
            out.append(self._release(next(d for d in self._order() if self.queues[d])))
        self.released = [0] * len(self.w)
        return out
