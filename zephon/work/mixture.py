"""Exact mixture proportions by closed-form allocation.

Position ``t`` of the mixed stream is assigned to a dataset without any running state, so the
allocation is random-access. Datasets are split into a balanced binary tree; at a node whose left
subtree has integer weight ``wl`` out of ``w``, the left side owns the first ``floor(t * wl / w)``
of the first ``t`` positions (a Bresenham line). Hence after ``t`` positions every dataset holds its
share ``t * w_d / W`` to within one sample per tree level (``ceil(log2 D)``).
"""
from __future__ import annotations

import math
from fractions import Fraction

import numpy as np

_EXACT = 1 << 31  # integer weights are kept exactly up to this reduced total
_SCALE = 1 << 20  # otherwise they are rounded to multiples of 2**-20 of the total


def integer_weights(weights) -> list[int]:
    """Positive integer weights with the same proportions: exact when the weights are ints or simple
    fractions whose reduced total is at most 2**31, else rounded to multiples of 2**-20 of the total
    (a weight below that becomes 1). ``weights``: positive finite numbers, one per dataset.
    Raises ``ValueError`` on an empty list or a non-positive / non-finite weight."""
    weights = list(weights)
    if not weights:
        raise ValueError("a mixture needs at least one dataset")
    for w in weights:
        if not isinstance(w, (int, float, Fraction)) or not math.isfinite(w) or w <= 0:
            raise ValueError(f"mixture weights must be finite numbers > 0, got {weights}")
    fracs = [Fraction(w) for w in weights]
    denom = math.lcm(*(f.denominator for f in fracs))
    ints = [int(f * denom) for f in fracs]
    g = math.gcd(*ints)
    ints = [i // g for i in ints]
    if sum(ints) > _EXACT:
        total = sum(fracs)
        ints = [max(1, round(f / total * _SCALE)) for f in fracs]
        g = math.gcd(*ints)
        ints = [i // g for i in ints]
    return ints


class Mixture:
    """Closed-form allocation of stream positions to datasets.

    ``Mixture(weights)``; ``assign(t) -> (dataset_ids, draw_index)``: for int64 array ``t`` of stream
    positions, the dataset of each and how many earlier positions went to the same dataset (its
    ``k``-th draw). ``count(d, t)``: draws of dataset ``d`` among the first ``t`` positions (exact int).
    """

    def __init__(self, weights):
        self.weights = integer_weights(weights)
        self.num_datasets = len(self.weights)
        # Tree as nested (left, right, wl, w) tuples; leaves are dataset ids.
        self._tree = self._build(list(range(self.num_datasets)))

    def _build(self, ids):
        if len(ids) == 1:
            return ids[0]
        mid = len(ids) // 2
        wl = sum(self.weights[i] for i in ids[:mid])
        w = wl + sum(self.weights[i] for i in ids[mid:])
        return (self._build(ids[:mid]), self._build(ids[mid:]), wl, w)

    def assign(self, t: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        t = np.asarray(t, dtype=np.int64)
        if t.size and (int(t.max()) + 1) * sum(self.weights) >= 1 << 62:
            t = t.astype(object)  # Python ints: exact beyond int64 (slow, only for huge positions)
        ds = np.empty(t.shape, dtype=np.int64)
        ks = np.empty(t.shape, dtype=t.dtype)
        self._assign(self._tree, t, np.arange(t.size), ds, ks)
        return ds, ks.astype(np.int64)

    def _assign(self, node, t, where, ds, ks):
        if isinstance(node, int):
            ds[where] = node
            ks[where] = t
            return
        left, right, wl, w = node
        before = (t * wl) // w
        is_left = ((t + 1) * wl) // w > before
        self._assign(left, before[is_left], where[is_left], ds, ks)
        self._assign(right, (t - before)[~is_left], where[~is_left], ds, ks)

    def count(self, d: int, t: int) -> int:
        node, t = self._tree, int(t)
        while not isinstance(node, int):
            left, right, wl, w = node
            before = (t * wl) // w
            if d < self._first_right(node):
                node, t = left, before
            else:
                node, t = right, t - before
        return t

    def _first_right(self, node) -> int:
        right = node[1]
        while not isinstance(right, int):
            right = right[0]
        return right
