"""Exact mixture proportions by closed-form allocation.

Position ``t`` of the mixed stream is assigned to a dataset without any running state, so the
allocation is random-access. Datasets are split into a balanced binary tree; at a node whose left
subtree has integer weight ``wl`` out of ``w``, the left side owns the first ``floor(t * wl / w)``
of the first ``t`` positions (a Bresenham line). Hence after ``t`` positions every dataset holds its
share ``t * w_d / W`` to within one sample per tree level (``ceil(log2 D)``).
"""
from __future__ import annotations

import bisect
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


class _TreeAllocation:
    """The walk both allocations share: a balanced binary tree of datasets (leaves are dataset ids; a node is a
    dict with ``left``, ``right`` and ``first_right``, the first dataset id on its right). A node's left child
    owns ``split(node, i)`` of the node's first ``i`` positions, a non-decreasing function rising by 0 or 1 per
    position; subclasses define it (``_split`` for one int, ``_split_many`` for an int array)."""

    def _split(self, node, i: int) -> int:
        raise NotImplementedError

    def _split_many(self, node, i: np.ndarray) -> np.ndarray:
        raise NotImplementedError

    def _walk(self, t: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        ds = np.empty(t.shape, dtype=np.int64)
        ks = np.empty(t.shape, dtype=t.dtype)
        self._assign(self._tree, t, np.arange(t.size), ds, ks)
        return ds, ks.astype(np.int64)

    def _assign(self, node, t, where, ds, ks):
        if isinstance(node, int):
            ds[where] = node
            ks[where] = t
            return
        both = self._split_many(node, np.concatenate([t, t + 1]))  # one call: t and t + 1
        before = both[:t.size]
        is_left = both[t.size:] > before
        self._assign(node["left"], before[is_left], where[is_left], ds, ks)
        self._assign(node["right"], (t - before)[~is_left], where[~is_left], ds, ks)

    def count(self, d: int, t: int) -> int:
        """Draws of dataset ``d`` among the first ``t`` positions (exact int)."""
        node, t = self._tree, int(t)
        while not isinstance(node, int):
            before = self._split(node, t)
            node, t = (node["left"], before) if d < node["first_right"] else (node["right"], t - before)
        return t


class Mixture(_TreeAllocation):
    """Closed-form allocation of stream positions to datasets.

    ``Mixture(weights)``; ``assign(t) -> (dataset_ids, draw_index)``: for int64 array ``t`` of stream
    positions, the dataset of each and how many earlier positions went to the same dataset (its
    ``k``-th draw). ``count(d, t)``: draws of dataset ``d`` among the first ``t`` positions (exact int).
    """

    def __init__(self, weights):
        self.weights = integer_weights(weights)
        self.num_datasets = len(self.weights)
        self._tree = self._build(list(range(self.num_datasets)))

    def _build(self, ids):
        if len(ids) == 1:
            return ids[0]
        mid = len(ids) // 2
        wl = sum(self.weights[i] for i in ids[:mid])
        w = wl + sum(self.weights[i] for i in ids[mid:])
        return {"left": self._build(ids[:mid]), "right": self._build(ids[mid:]), "first_right": ids[mid],
                "wl": wl, "w": w}

    def _split(self, node, i: int) -> int:  # a Bresenham line: the left side's share of the first i
        return (i * node["wl"]) // node["w"]

    _split_many = _split  # the same arithmetic on int64 (or object, past int64) arrays

    def assign(self, t: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        t = np.asarray(t, dtype=np.int64)
        if t.size and (int(t.max()) + 1) * sum(self.weights) >= 1 << 62:
            t = t.astype(object)  # Python ints: exact beyond int64 (slow, only for huge positions)
        return self._walk(t)


class ScheduledMixture(_TreeAllocation):
    """Closed-form allocation under a ``schedule.Schedule``: shares that change with the step.

    ``ScheduledMixture(schedule, step_size)``; same interface as ``Mixture`` (``assign``, ``count``) over
    step-major positions ``u`` (position ``u`` lies in step ``u // step_size``). The same balanced tree of
    datasets; a node holding the datasets of ``n`` has the cumulative target ``G_n(u)`` (the integral of its
    share, exact Fractions) and its left child gets ``floor(Λ(i))`` of the node's first ``i`` positions, where
    ``Λ(i) = G_left(G_n^-1(i))``: the static Bresenham split ``floor(i * wl / w)`` when shares are constant.
    Increments are 0/1 per position and every node's count stays within one per tree level of its target
    (``ceil(log2 D)`` for a dataset, at every position). No state grows with the position: ``Λ`` is
    evaluated from the segments, one step at a time."""

    def __init__(self, schedule, step_size: int):
        if not isinstance(step_size, int) or step_size < 1:
            raise ValueError(f"step_size must be an int >= 1, got {step_size!r}")
        self.schedule, self.step_size = schedule, step_size
        self.num_datasets = schedule.num_datasets
        self._steps = [seg[0] for seg in schedule.segments]
        self._tree = self._build(list(range(self.num_datasets)))

    def _build(self, ids):
        if len(ids) == 1:
            return ids[0]
        mid = len(ids) // 2
        left, right = self._build(ids[:mid]), self._build(ids[mid:])
        segs, gn, gl = [], Fraction(0), Fraction(0)
        for a, n, p0, p1 in self.schedule.segments:
            s0, s1 = sum(p0[i] for i in ids), sum(p1[i] for i in ids)
            l0, l1 = sum(p0[i] for i in ids[:mid]), sum(p1[i] for i in ids[:mid])
            segs.append((a, n, s0, s1, l0, l1, gn, gl))
            if n is not None:
                gn += self.step_size * _cum(s0, s1, n, n)
                gl += self.step_size * _cum(l0, l1, n, n)
        return {"left": left, "right": right, "first_right": ids[mid], "segs": segs, "starts": [s[6] for s in segs],
                "cache": {}, "last": (0, 0)}

    @property
    def weights(self) -> list[int]:
        """Static stand-in weights for bounds (``Loader``'s dry-lane limit): each dataset's smallest positive
        share over the schedule, as integers, so a pass at these weights is at least as long as any phase's."""
        low = [min((p[d] for _, _, p0, p1 in self.schedule.segments for p in (p0, p1) if p[d] > 0),
                   default=None) for d in range(self.num_datasets)]
        floor = min(x for x in low if x is not None)
        return integer_weights([x if x is not None else floor for x in low])

    # -- the split function of one node -------------------------------------------------------------
    def _target(self, seg, m: int) -> Fraction:
        a, n, s0, s1, _, _, gn, _ = seg
        return gn + self.step_size * _cum(s0, s1, n, m)

    def _search(self, seg, i: int) -> int:
        """Largest m in ``[0, n)`` with the node's target at step ``a + m`` at most ``i`` (exact bisection)."""
        lo, hi = 0, seg[1] - 1
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if self._target(seg, mid) <= i:
                lo = mid
            else:
                hi = mid - 1
        return lo

    def _estimate(self, seg, i: int) -> int:
        """A float guess of ``_search`` (the quadratic's root), checked exactly by the caller."""
        a, n, s0, s1, _, _, gn, _ = seg
        r, s0f = float(i - gn) / self.step_size, float(s0)
        c = float(s0 - s1) / (2 * n)
        b = s0f + c
        root = b + math.sqrt(max(0.0, b * b - 4 * c * r))
        m = 2 * r / root if root > 0 else 0.0
        return min(max(0, int(m)) if math.isfinite(m) else 0, n - 1)

    def _piece(self, node, i: int):
        """``(lo, hi, P, M, N)``: for every integer ``j`` in ``[lo, hi)`` (hi None: no end), the node's target
        is in the same step as at ``i`` and ``floor(Λ(j)) = (P + j * M) // N`` (exact ints)."""
        if node is self._tree:  # the root's target is the position itself: its step is i // step_size
            step = i // self.step_size
            k = bisect.bisect_right(self._steps, step) - 1
            return self._piece_at(node, k, step - self._steps[k])
        k, m = node["last"]  # consecutive queries mostly land in the step after the last one
        for mm in (m, m + 1):
            n = node["segs"][k][1]
            if n is None or mm < n:
                pc = self._piece_at(node, k, mm)
                if pc[0] <= i and (pc[1] is None or i < pc[1]):
                    return pc
        k = bisect.bisect_right(node["starts"], i) - 1
        seg = node["segs"][k]
        a, n, s0, s1, l0, l1, gn, gl = seg
        if s0 == s1 == 0:  # flat: only the last segment can hold i (else a later start would be <= i); the node
            return math.ceil(gn), None, math.floor(gl), 0, 1  # gets no more share, its left side nothing more
        if n is None or s0 == s1:
            m = int((i - gn) // (self.step_size * s0))
        else:
            m = self._estimate(seg, i)
        for _ in range(4):
            pc = self._piece_at(node, k, m)
            if i < pc[0] and m > 0:
                m -= 1
            elif pc[1] is not None and i >= pc[1] and (n is None or m < n - 1):
                m += 1
            else:
                return pc
        return self._piece_at(node, k, self._search(seg, i))

    def _piece_at(self, node, k: int, m: int):
        cache = node["cache"]
        node["last"] = (k, m)
        if (k, m) in cache:
            return cache[k, m]
        seg = node["segs"][k]
        a, n, s0, s1, l0, l1, gn, gl = seg
        g, share = self._target(seg, m), _at(s0, s1, n, m)
        ratio = _at(l0, l1, n, m) / share
        base = gl + self.step_size * _cum(l0, l1, n, m) - g * ratio  # Λ(j) = base + j * ratio in this step
        d = base.denominator * ratio.denominator
        if len(cache) >= 1 << 14:
            cache.clear()
        cache[k, m] = out = (math.ceil(g), math.ceil(g + self.step_size * share),
                             base.numerator * ratio.denominator, ratio.numerator * base.denominator, d)
        return out

    def _split(self, node, i: int) -> int:
        _, _, p, m, n = self._piece(node, i)
        return (p + i * m) // n

    def _split_many(self, node, i: np.ndarray) -> np.ndarray:
        uniq, inv = np.unique(i, return_inverse=True)
        vals, k, xs = [], 0, uniq.tolist()
        while k < len(xs):
            _, hi, p, m, n = self._piece(node, xs[k])
            stop = len(xs) if hi is None else max(k + 1, int(np.searchsorted(uniq, hi)))
            vals += [(p + x * m) // n for x in xs[k:stop]]
            k = stop
        return np.asarray(vals, dtype=np.int64)[inv.reshape(i.shape)]

    # -- Mixture's interface --------------------------------------------------------------------------
    def assign(self, u: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """For int64 array ``u`` of step-major positions: each one's dataset and draw index (as ``Mixture``)."""
        return self._walk(np.asarray(u, dtype=np.int64))

    def reach(self, u: int) -> int | None:
        """The step R such that the allocation of positions ``[0, u)`` reads the schedule before step R only
        (None: it reads the last phase, whatever its length). Used to decide whether a schedule extended after
        a checkpoint draws the checkpoint's positions the same way."""
        out, todo = 0, [(self._tree, int(u))]
        while todo:
            node, i = todo.pop()
            if isinstance(node, int):
                continue
            seg = node["segs"][bisect.bisect_right(node["starts"], i) - 1]
            a, n, s0, s1, *_ = seg
            if s0 == s1 == 0:  # past the node's last target: the last phase decides, for ever
                if i > seg[6]:
                    return None
                m = 0
            elif n is None or s0 == s1:
                m = int((i - seg[6]) // (self.step_size * s0))
            else:
                m = self._search(seg, i)
            out = max(out, a + m + (1 if i > self._target(seg, m) else 0))
            before = self._split(node, i)
            todo += [(node["left"], before), (node["right"], i - before)]
        return out


def _cum(s0: Fraction, s1: Fraction, n: int | None, m: int) -> Fraction:
    """Sum of a segment's share over its first ``m`` steps (share ``((n - j) s0 + j s1) / n`` at step j)."""
    if n is None or s0 == s1:
        return s0 * m
    return s0 * m - (s0 - s1) * Fraction(m * (m - 1), 2 * n)


def _at(s0: Fraction, s1: Fraction, n: int | None, m: int) -> Fraction:
    return s0 if n is None or s0 == s1 else (s0 * (n - m) + s1 * m) / n
