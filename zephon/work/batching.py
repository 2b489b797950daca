"""Batching methods: which dataset each slot of a global step draws from (Mosaic's ``batching_method``).

A slot is a step-major position ``u = step * step_size + lane * rows_per_lane_step + row`` (``WorkSource``
maps lane positions to it), so a composition is a function of the canonical slot alone: it never depends on
dp_degree, ranks or workers. Every composition is closed-form and random-access, as ``Mixture`` is:
``assign(u) -> (dataset_ids, draw_index)`` and ``count(d, u)`` (draws of ``d`` among the first ``u`` slots).

- ``random``: the plain mixture over the chunk-major stream (``Mixture``; not built here).
- ``stratified``: every step holds ``counts[d]`` slots of dataset ``d``, Mosaic's rounding of the proportions
  (``stratified_counts``), laid out dataset after dataset inside the step as Mosaic concatenates them.
- ``per_stream``: every step is one dataset's; steps go to datasets in proportion (a ``Mixture`` over steps).
- ``device_per_stream``: every lane step (``rows_per_lane_step`` slots, a canonical device micro-batch) is one
  dataset's; lane steps go to datasets in proportion (a ``Mixture`` over lane steps, step-major).

See docs/streaming.md ("Batching methods").
"""
from __future__ import annotations

import numpy as np

from .mixture import Mixture
from .permute import IndexPermutation, derive_key

BATCHING_METHODS = ("random", "stratified", "per_stream", "device_per_stream")


def check_method(method) -> str:
    """``method`` if it is one of ``BATCHING_METHODS``. Raises ValueError naming the valid ones."""
    if method not in BATCHING_METHODS:
        raise ValueError(f"batching must be one of {BATCHING_METHODS}, got {method!r}")
    return method


def stratified_counts(proportions, step_size: int) -> list[int]:
    """Slots per step of each dataset under ``stratified`` batching, rounded as mosaicml-streaming rounds.

    proportions: positive numbers, one per dataset (normalised here, in float64). step_size: slots per step
    (the global batch). Each count is ``floor(p * step_size)``; the slots left over go one each to the
    datasets with the largest fractional parts (ties: the higher dataset index first). Raises ValueError
    when a dataset gets no slot (its share of the step is below one)."""
    p = np.asarray(proportions, dtype=np.float64)
    if p.ndim != 1 or not p.size or not np.all(np.isfinite(p)) or np.any(p <= 0):
        raise ValueError(f"proportions must be finite numbers > 0, got {list(proportions)}")
    p = p / p.sum()
    counts = (p * step_size).astype(np.int64)
    missing = int(step_size - counts.sum())
    if missing > 0:
        left = step_size * p - counts
        counts[np.flip(np.argsort(left, kind="stable"))[:missing]] += 1
    for d, c in enumerate(counts.tolist()):
        if c <= 0:
            raise ValueError(f"stratified batching: dataset {d} gets {c} of the {step_size} slots of a step (its "
                             f"share {p[d]:.4g} is too low): raise the global batch size or its proportion")
    return [int(c) for c in counts]


class StratifiedComposition:
    """``stratified``: step ``s`` holds, at its slots ``[start_d, start_d + counts[d])``, draws
    ``s * counts[d] ...`` of dataset ``d``. ``counts``: slots per step per dataset (sum = ``step_size``).
    ``weights`` (the counts) are the long-run shares."""

    def __init__(self, counts, step_size: int):
        if sum(counts) != step_size or min(counts) < 1:
            raise ValueError(f"stratified counts {list(counts)} must be >= 1 and sum to step_size={step_size}")
        self.counts = np.asarray(counts, dtype=np.int64)
        self.ends = np.cumsum(self.counts)
        self.starts = self.ends - self.counts
        self.step_size, self.num_datasets = int(step_size), len(counts)
        self.weights = [int(c) for c in counts]

    def assign(self, u: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Dataset and draw index of each step-major slot in int64 array ``u``."""
        s, i = np.divmod(np.asarray(u, dtype=np.int64), self.step_size)
        d = np.searchsorted(self.ends, i, side="right")
        return d.astype(np.int64), s * self.counts[d] + i - self.starts[d]

    def count(self, d: int, u: int) -> int:
        """Draws of dataset ``d`` among the first ``u`` slots."""
        s, i = divmod(int(u), self.step_size)
        c = int(self.counts[d])
        return s * c + min(max(i - int(self.starts[d]), 0), c)


class BlockComposition:
    """``per_stream`` / ``device_per_stream``: slots come in blocks of ``block`` consecutive slots, block ``b``
    wholly from one dataset. Blocks are dealt in rounds of ``W = sum(weights)`` (integer weights, reduced):
    each round holds exactly ``weights[d]`` blocks of dataset ``d`` (a ``Mixture`` over the round's blocks) in
    an order shuffled per round by ``seed`` (as Mosaic shuffles its batches' streams), so no lane is tied to
    one dataset. Every draw index of a dataset is used once: its ``k``-th block in mixture order holds draws
    ``k * block ...``."""

    def __init__(self, weights, block: int, seed: int = 0):
        if not isinstance(block, int) or block < 1:
            raise ValueError(f"block must be an int >= 1, got {block!r}")
        self.blocks, self.block, self.seed = Mixture(weights), block, int(seed)
        self.weights, self.num_datasets = self.blocks.weights, self.blocks.num_datasets
        self.round = sum(self.weights)

    def _mixed(self, b: np.ndarray) -> np.ndarray:
        """Block indexes -> their place in the mixture order (a bijection, one shuffle per round)."""
        r, i = np.divmod(b, self.round)
        out = np.empty_like(b)
        for rr in np.unique(r).tolist():
            sel = r == rr
            out[sel] = rr * self.round + IndexPermutation(self.round, derive_key(self.seed, "blocks", rr))(i[sel])
        return out

    def assign(self, u: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Dataset and draw index of each step-major slot in int64 array ``u``."""
        b, j = np.divmod(np.asarray(u, dtype=np.int64), self.block)
        d, k = self.blocks.assign(self._mixed(b))
        return d, k * self.block + j

    def count(self, d: int, u: int) -> int:
        """Draws of dataset ``d`` among the first ``u`` slots (costs one pass over a partial round)."""
        b, j = divmod(int(u), self.block)
        r, i = divmod(b, self.round)
        first = self.blocks.assign(self._mixed(np.arange(r * self.round, b + (j > 0), dtype=np.int64)))[0]
        c = r * self.weights[d] + int(np.count_nonzero(first[:i] == d))
        return c * self.block + (j if j and int(first[i]) == d else 0)


def composition(method: str, weights, *, step_size: int, canonical_replicas: int, seed: int = 0):
    """The composition of a non-random ``method`` (see the module docstring).

    weights: positive numbers per dataset (proportions of samples; for ``per_stream`` / ``device_per_stream``
    the proportions of blocks). step_size: slots per step (a multiple of ``canonical_replicas``).
    canonical_replicas: lanes. seed: shuffles the order of blocks within each round. Raises ValueError for
    ``random`` or an unknown method, bad weights, or a dataset with no slot in a stratified step."""
    check_method(method)
    if method == "stratified":
        return StratifiedComposition(stratified_counts(weights, step_size), step_size)
    if method == "per_stream":
        return BlockComposition(weights, step_size, seed)
    if method == "device_per_stream":
        return BlockComposition(weights, step_size // canonical_replicas, seed)
    raise ValueError("batching='random' is the plain mixture (Mixture), not a composition")


def epoch_steps(method: str, choose, proportions, *, step_size: int, canonical_replicas: int):
    """Whole steps an epoch of ``choose[d]`` samples per dataset holds under ``method``, and the weights to
    build its composition with, so that no dataset is drawn more than ``choose[d]`` times in the epoch.

    method: a ``BATCHING_METHODS`` entry other than ``random``. choose: samples per epoch per dataset (ints).
    proportions: the datasets' shares (``stratified`` rounds them per step). step_size: slots per step (the
    global batch). canonical_replicas: lanes. Returns ``(steps, weights)``: ``stratified`` gives
    ``min(choose[d] // counts[d])`` steps; ``per_stream`` ``choose[d] // step_size`` steps of each dataset
    (the leftovers dropped, as Mosaic drops incomplete batches); ``device_per_stream`` ``choose[d] //
    rows_per_lane_step`` lane steps of each dataset, cut to whole steps. Raises ValueError for a dataset too
    small for one step (or lane step) of its own, as Mosaic does."""
    check_method(method)
    choose = [int(c) for c in choose]
    if method == "stratified":
        counts = stratified_counts(proportions, step_size)
        return min(c // k for c, k in zip(choose, counts)), list(proportions)
    block = step_size if method == "per_stream" else step_size // canonical_replicas
    blocks = [c // block for c in choose]
    for d, (b, c) in enumerate(zip(blocks, choose)):
        if b < 1:
            what = "global batch" if method == "per_stream" else "lane step (a canonical device micro-batch)"
            raise ValueError(f"{method} batching: dataset {d} has {c} samples per epoch, fewer than one "
                             f"{what} of {block}; it would never be drawn")
    return sum(blocks) * block // step_size, blocks
