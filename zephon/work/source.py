"""WorkSource: datasets + mixture weights + seed + shuffle settings -> per-lane chunks of pointers.

Pure and random-access: ``chunk(lane, chunk_id)`` is computed directly, so a checkpoint stores only
chunk ids, never pointer lists. The global stream is the mixture of dataset passes; position ``t`` of
it belongs to global chunk ``t // chunk_size``, and global chunk ``g`` belongs to lane
``g % canonical_replicas`` as that lane's chunk ``g // canonical_replicas``. A finite stream's end is split
so that no lane ends a pass far ahead of another: when the datasets know their samples' sizes, its last whole
round and the rest go to the lanes as contiguous segments of equal bytes (whole rounds counted; ``balance``),
else the rest alone is split evenly by count (every lane's last chunk an equal share, to within one position).
"""
from __future__ import annotations

from functools import lru_cache

import warnings

import numpy as np

from .balance import tail_layout
from .chunk import ChunkPointers
from .batching import check_method, composition
from .mixture import Mixture, ScheduledMixture
from .permute import IndexPermutation, derive_key
from .schedule import Schedule, resume_horizon
from .source_options import EXHAUSTION_POLICIES  # noqa: F401  (re-exported: where it was defined)
from .source_options import check_options, checked_epochs, checked_quota, checked_step, checked_weights


class PartialPassWarning(UserWarning):
    """A finite pass (``exhaustion="stop"`` / ``"fill"``) ends, at its mixture weights, before some datasets
    were read whole: it stops when the first dataset runs out. The message names the datasets and how many of
    their samples are left unread."""


class WorkSource:
    """Pointer streams for ``canonical_replicas`` lanes.

    Args:
        datasets: objects with ``name`` (str), ``shard_sizes`` (list of sample counts per shard) and
            ``fingerprint()`` (plain JSON data); no I/O happens here.
        weights: mixture weights, one per dataset (proportions of samples); default equal. Or a
            ``schedule.Schedule``: weights that change with the global step (needs ``step_size`` and
            ``exhaustion="repeat"``; docs/curricula.md).
        seed: int.
        canonical_replicas: number of lanes (>= 1).
        chunk_size: pointers per chunk (>= 1).
        shuffle: permute shard order and samples each pass (a different permutation per pass).
        shuffle_block_size: None = permute samples within each shard; an int B = permute within
            consecutive blocks of B samples of the pass's shard-shuffled concatenation (spans shards).
        exhaustion: ``"repeat"`` (each dataset restarts with a new pass: an endless stream), ``"stop"``
            (the stream ends just before any dataset would start its second pass) or ``"fill"`` (as
            ``"stop"``, then extended to a multiple of ``fill_multiple`` positions by repeating the pass's
            first positions' samples: Mosaic's epoch, every sample at least once) or ``"quota"`` (the
            weights are ints, each dataset's draws in one pass: the stream ends after ``sum(weights)`` positions,
            dataset ``d`` having had exactly ``weights[d]`` draws from its own stream of shuffled passes, so a
            weight of 1.5x its size reads it once and half again; Energon's ``blend_epochized`` epoch). Its
            ``with_period(p)`` is the ``p``-th such pass: each dataset's stream continues where pass ``p - 1`` left it.
        fill_multiple: positions the ``"fill"`` stream's length is a multiple of (a global batch).
        step_size: positions per global step (the loader's ``global_batch_size``), used by a schedule only (its
            ``positions_per_step`` wins when set); a multiple of ``canonical_replicas``. A scheduled mixture
            allocates in step-major order: lane ``l``'s ``j``-th position of step ``s`` is position
            ``s * step_size + l * step_size / canonical_replicas + j``, so a step's draws follow that step's
            shares exactly, at any chunk size.
        batching: ``"random"`` (the mixture over the stream) or a ``batching.BATCHING_METHODS`` composition
            (``"stratified"``, ``"per_stream"``, ``"device_per_stream"``): which dataset each slot of a step
            draws from, over the same step-major positions as a schedule (needs ``step_size`` and
            ``exhaustion="repeat"``, no schedule).
        epochs_per_pass: None, or one int >= 1 per dataset: dataset ``d``'s pass is ``epochs_per_pass[d]`` copies
            of it shuffled together (Energon's ``shuffle_over_epochs_multiplier``): over a pass each sample is
            drawn that many times, in any order. ``stop`` ends, and the mixture counts, such passes.
        split: how a ``"stop"`` / ``"fill"`` pass's end goes to the lanes: ``"count"`` (equal numbers of samples)
            or ``"size"`` (equal bytes, when the datasets know their samples' sizes: ``balance``; for packed
            rows, whose count follows the tokens).
        rows: with ``split="size"``, None or ``(tokens per row, tokens_of)`` for packed rows: ``tokens_of(pointers)``
            gives sampled pointers' tokens, so each lane's share is planned as whole rows (``balance``).
        step_major: allocate a ``"random"`` mixture over step-major positions too (needs ``step_size``), so the
            first ``S`` global steps draw exactly the first ``S x step_size`` positions of the mixture: an epoch
            cut from an endless stream (Mosaic's ``proportion`` / ``epoch_size``) then reads each dataset's
            first draws, never a later pass's, whatever ``chunk_size``. Schedules and compositions always are.
    Raises ``ValueError`` on an empty dataset list, a dataset with no samples, bad weights or options.
    """

    def __init__(self, datasets, weights=None, *, seed: int = 0, canonical_replicas: int = 1,
                 chunk_size: int = 1024, shuffle: bool = True, shuffle_block_size: int | None = None,
                 exhaustion: str = "repeat", fill_multiple: int = 1, step_size: int | None = None,
                 batching: str = "random", epochs_per_pass=None, split: str = "count",
                 step_major: bool = False, rows=None):
        if split not in ("count", "size"):
            raise ValueError(f"split must be 'count' or 'size', got {split!r}")
        self.split = split if exhaustion in ("stop", "fill") else "count"
        self.rows = rows if self.split == "size" else None
        weights = checked_weights(datasets, weights)
        check_options(seed, canonical_replicas, chunk_size, exhaustion, fill_multiple, shuffle_block_size)
        self.quota = checked_quota(weights) if exhaustion == "quota" else None
        self.datasets = list(datasets)
        self.shard_sizes = [np.asarray(d.shard_sizes, dtype=np.int64) for d in self.datasets]
        self.sizes = [int(s.sum()) for s in self.shard_sizes]
        self.epochs_per_pass = checked_epochs(epochs_per_pass, len(self.datasets))
        # draws per pass of each dataset (its size, times its epochs per pass)
        self.pass_sizes = [n * m for n, m in zip(self.sizes, self.epochs_per_pass or [1] * len(self.sizes))]
        for d, n in zip(self.datasets, self.sizes):
            if n == 0:
                raise ValueError(f"dataset {d.name!r} has no samples")
        self.schedule, self.batching = None, check_method(batching)
        if batching != "random":
            self.step_size = checked_step(f"batching={batching!r}", step_size, exhaustion, canonical_replicas, weights)
            self.mixture = composition(batching, weights, step_size=self.step_size,
                                       canonical_replicas=canonical_replicas, seed=derive_key(seed, "batching"))
        elif isinstance(weights, Schedule):
            self.schedule = weights
            self.step_size = checked_step("a mixture schedule", weights.positions_per_step or step_size, exhaustion,
                                          canonical_replicas)
            self.mixture = ScheduledMixture(weights, self.step_size)
        else:
            self.mixture = Mixture(weights)
            if step_major:
                self.step_size = checked_step("step_major", step_size, exhaustion, canonical_replicas)
        self.step_major = bool(step_major) or self.schedule is not None or batching != "random"
        self.seed = int(seed)
        self.canonical_replicas = int(canonical_replicas)
        self.chunk_size = int(chunk_size)
        self.shuffle = bool(shuffle)
        self.shuffle_block_size = shuffle_block_size
        self.exhaustion = exhaustion
        self.fill_multiple = fill_multiple if exhaustion == "fill" else 1
        self.pass_positions = None if exhaustion == "repeat" else self._stop_length()
        if self.pass_positions == 0:
            raise ValueError("a finite pass over these datasets and weights holds no position (a dataset with a "
                             "tiny weight and few samples ends it at once)")
        self.total_positions = None if self.pass_positions is None else \
            -(-self.pass_positions // self.fill_multiple) * self.fill_multiple
        self.fill_positions = 0 if self.total_positions is None else self.total_positions - self.pass_positions
        if self.pass_positions is not None and self.quota is None:
            self._warn_partial_pass()
        self._pass_layout = lru_cache(maxsize=64)(self._pass_layout_uncached)
        self._shard_perm = lru_cache(maxsize=4096)(self._shard_perm_uncached)
        self._tail_layout = None  # (full rounds, base, bounds) of a finite stream: _tail()
        self.period = 0  # quota passes before this one (with_period)

    def with_period(self, period: int) -> "WorkSource":
        """This quota stream's pass ``period`` (0 = the first): positions ``[p x Q, (p + 1) x Q)`` of the endless
        mixture at the quota weights (``Q = sum(quota)``), where each dataset has had exactly ``p x quota`` draws
        before, so consecutive passes read on through each dataset's shuffled passes. Raises ``ValueError``
        without a quota or for a period that is not an int >= 0."""
        if self.quota is None or not isinstance(period, int) or period < 0:
            raise ValueError(f"with_period needs exhaustion='quota' and an int >= 0, got {self.exhaustion!r}, "
                             f"{period!r}")
        new = WorkSource.__new__(WorkSource)
        new.__setstate__(dict(self.__getstate__(), period=period))
        return new

    # A per-instance cache is not picklable: rebuild it (host loaders ship sources to spawned workers).
    def __getstate__(self):
        return {k: v for k, v in self.__dict__.items() if k not in ("_pass_layout", "_shard_perm")}

    def __setstate__(self, state):
        self.__dict__.update(state)
        self._pass_layout = lru_cache(maxsize=64)(self._pass_layout_uncached)
        self._shard_perm = lru_cache(maxsize=4096)(self._shard_perm_uncached)

    def _shard_perm_uncached(self, d: int, e: int, s: int) -> IndexPermutation:
        """The in-shard permutation of shard ``s`` of dataset ``d`` in pass ``e`` (cached: a scheduled mixture's
        step-major order spreads a chunk's draws over many shards)."""
        return IndexPermutation(int(self.shard_sizes[d][s]), derive_key(self.seed, "in-shard", d, e, s))

    def _step_major(self, t: np.ndarray) -> np.ndarray:
        """Global positions -> step-major positions (see ``step_size``): a bijection."""
        C, S = self.canonical_replicas, self.chunk_size
        rps = self.step_size // C
        g, o = t // S, t % S
        p = (g // C) * S + o  # the lane-local position of t in lane g % C
        return (p // rps) * self.step_size + (g % C) * rps + p % rps

    def check_resume(self, state: dict) -> None:
        """Accept a checkpoint made under another schedule when every position it depends on is drawn the
        same way here (the schedules agree up to ``schedule.resume_horizon``); the rest of the config is
        compared by the fingerprint. Raises ``ValueError`` naming the first step where they differ."""
        theirs = ((state.get("config") or {}).get("work") or {}).get("schedule")
        ours = self.fingerprint().get("schedule")
        if theirs == ours or theirs is None or ours is None:
            return
        try:
            old, new = Schedule.from_dict(theirs), Schedule.from_dict(ours)
        except (ValueError, TypeError) as e:
            raise ValueError(f"checkpoint schedule is malformed: {e}") from None
        first = old.first_difference(new)
        if first is None:
            return
        config = state.get("config") or {}
        need = resume_horizon(ScheduledMixture(old, self.step_size), state.get("lanes") or [],
                              flush_span=int(config.get("flush_span", 1)), chunk_size=self.chunk_size,
                              canonical_replicas=self.canonical_replicas)
        if need is None or first < need:
            until = "all its steps (a group of datasets is ahead of its target with weight 0 to the end)" \
                if need is None else f"steps 0..{need - 1}"
            raise ValueError(f"the schedule differs from the checkpoint's from step {first} (shares "
                             f"{_fmt(old.shares(first))} in the checkpoint, {_fmt(new.shares(first))} "
                             f"here); this checkpoint (step {state.get('step')}) restores only into a schedule "
                             f"equal to its own on {until}: start the new phase at step {need} or later")

    # -- configuration identity -------------------------------------------------------------
    def fingerprint(self) -> dict:
        """Plain JSON data that fixes every pointer this source can produce."""
        return {
            "seed": self.seed,
            "canonical_replicas": self.canonical_replicas,
            "chunk_size": self.chunk_size,
            "shuffle": self.shuffle,
            "shuffle_block_size": self.shuffle_block_size,
            "exhaustion": self.exhaustion,
            **({"fill_multiple": self.fill_multiple} if self.exhaustion == "fill" else {}),
            **({"quota": self.quota} if self.quota is not None else {}),
            **({"period": self.period} if getattr(self, "period", 0) else {}),
            **({"epochs_per_pass": self.epochs_per_pass} if self.epochs_per_pass else {}),
            **({"split": "size"} if self.split == "size" else {}),
            **({"weights": "schedule", "schedule": {**self.schedule.to_dict(), "positions_per_step": self.step_size}}
               if self.schedule is not None else {"weights": self.mixture.weights}),
            **({"batching": self.batching, "step_size": self.step_size} if self.batching != "random" else {}),
            **({"step_major": self.step_size} if self.step_major and self.batching == "random"
               and self.schedule is None else {}),
            "datasets": [d.fingerprint() for d in self.datasets],
        }

    # -- stream length ------------------------------------------------------------------------
    def _stop_length(self) -> int:
        """Largest T such that no dataset gets more than one pass of draws among positions [0, T) (with a quota:
        the quotas' sum, after which each dataset has had exactly its quota: ``Mixture`` is exact at its period)."""
        if self.quota is not None:
            return sum(self.quota)
        limits = []
        for d, n in enumerate(self.pass_sizes):
            lo, hi = 0, 1
            while self.mixture.count(d, hi) <= n:
                hi *= 2
            while hi - lo > 1:  # count(d, lo) <= n < count(d, hi)
                mid = (lo + hi) // 2
                if self.mixture.count(d, mid) <= n:
                    lo = mid
                else:
                    hi = mid
            limits.append(lo)
        return min(limits)

    def unread_samples(self) -> list[int] | None:
        """Per dataset, the samples one finite pass leaves unread (its size minus its draws among the pass's
        positions: closed form, no pointer is made); None for an endless stream."""
        if self.pass_positions is None:
            return None
        return [n - self.mixture.count(d, self.pass_positions) for d, n in enumerate(self.pass_sizes)]

    def _warn_partial_pass(self) -> None:
        """Say (``PartialPassWarning``) which datasets a finite pass leaves partly unread, and how to read them."""
        unread = self.unread_samples()
        left = [(d, k) for d, k in enumerate(unread) if k > 0]
        if not left:
            return
        first = [self.datasets[d].name for d, k in enumerate(unread) if k == 0]
        what = ", ".join(f"{self.datasets[d].name!r} {k:,} of {self.sizes[d]:,} samples" for d, k in left)
        warnings.warn(f"exhaustion={self.exhaustion!r}: one pass at weights {_fmt(self.mixture.weights)} ends after "
                      f"{self.pass_positions:,} samples, when {', '.join(map(repr, first))} runs out; left unread: "
                      f"{what}. For every sample once, use weights proportional to the dataset sizes "
                      f"({self.sizes}); for the weights as given, exhaustion='repeat'", PartialPassWarning,
                      stacklevel=4)

    def _tail(self):
        """``(full_rounds, base, bounds)`` of a finite stream: ``full_rounds`` rounds of whole chunks, then the
        rest from position ``base``, lane ``l`` taking positions ``[base + bounds[l], base + bounds[l + 1])``
        in chunks of ``chunk_size``. Split by size (``balance``) when the datasets know their samples' sizes,
        else evenly by count (one chunk per lane, ``q + 1`` positions for lanes below ``r``, ``q`` for the
        others). Computed once."""
        if self._tail_layout is None:
            self._tail_layout = tail_layout(self)
        return self._tail_layout

    def num_chunks(self, lane: int) -> int | None:
        """Chunks lane ``lane`` will ever have (None for an endless stream)."""
        if self.total_positions is None:
            return None
        full, _, bounds = self._tail()
        return full + -(-int(bounds[lane + 1] - bounds[lane]) // self.chunk_size)

    def lane_positions(self, lane: int) -> int | None:
        """Pointers lane ``lane`` gets in a finite stream (None for an endless one): its whole chunks and
        its share of the last round(s)."""
        if self.total_positions is None:
            return None
        full, _, bounds = self._tail()
        return full * self.chunk_size + int(bounds[lane + 1] - bounds[lane])

    # -- random access ------------------------------------------------------------------------
    def chunk(self, lane: int, chunk_id: int) -> ChunkPointers:
        """The pointers of chunk ``chunk_id`` of ``lane`` (empty past the end of a finite stream)."""
        if not 0 <= lane < self.canonical_replicas:
            raise IndexError(f"lane {lane} outside [0, {self.canonical_replicas})")
        if chunk_id < 0:
            raise IndexError(f"chunk_id must be >= 0, got {chunk_id}")
        start = (chunk_id * self.canonical_replicas + lane) * self.chunk_size
        stop = start + self.chunk_size
        if self.total_positions is not None:
            full, base, bounds = self._tail()
            if chunk_id >= full:  # the lane's segment of the split last round(s), or past the end
                end = base + int(bounds[lane + 1])
                start = min(base + int(bounds[lane]) + (chunk_id - full) * self.chunk_size, end)
                stop = min(start + self.chunk_size, end)
        return self.pointers(lane, chunk_id, np.arange(start, stop, dtype=np.int64))

    def pointers(self, lane: int, chunk_id: int, positions: np.ndarray) -> ChunkPointers:
        """Resolve global stream positions to sample pointers. A ``"fill"`` stream's positions past the
        pass resolve as the pass's first positions (the repeats), keeping their own position as identity."""
        ds, draws = self._draws(positions)
        shard_ids = np.empty_like(positions)
        sample_idx = np.empty_like(positions)
        passes = np.empty_like(positions)
        for d in np.unique(ds):
            sel = ds == d
            n = self.pass_sizes[d]
            k = draws[sel]
            passes[sel] = k // n
            s, i = self._resolve(int(d), k // n, k % n)
            shard_ids[sel] = s
            sample_idx[sel] = i
        return ChunkPointers(lane, chunk_id, positions, ds, shard_ids, sample_idx, passes)

    def dataset_ids(self, positions: np.ndarray) -> np.ndarray:
        """The dataset id of each global stream position (int64 array): ``pointers``' ``dataset_ids`` without
        resolving shards and samples (the mixture's allocation only)."""
        return self._draws(positions)[0]

    def _draws(self, positions: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``(dataset ids, draw index within each dataset)`` of global stream positions ``positions``."""
        drawn = positions if not self.fill_positions else positions % self.pass_positions
        if self.step_major:
            drawn = self._step_major(drawn)
        if self.period:  # a later quota pass: the endless mixture's period ``period`` (exact at its multiples)
            drawn = drawn + self.period * self.pass_positions
        return self.mixture.assign(drawn)

    def _resolve(self, d: int, passes: np.ndarray, p: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``(shards, indexes)`` of draws ``p`` (in ``[0, pass_sizes[d])``) of passes ``passes`` of dataset ``d``.
        A pass of m epochs is one permutation of m copies: copy ``c`` of it reads as epoch ``pass * m + c``."""
        shards = np.empty_like(p)
        idx = np.empty_like(p)
        m, n = self.pass_sizes[d] // self.sizes[d], self.sizes[d]
        for e in np.unique(passes):
            sel = passes == e
            q = p[sel]
            if m == 1:
                shards[sel], idx[sel] = self._resolve_pass(d, int(e), q)
                continue
            if self.shuffle:
                q = IndexPermutation(m * n, derive_key(self.seed, "over-epochs", d, int(e)))(q)
            sub_s, sub_i = np.empty_like(q), np.empty_like(q)
            for c in np.unique(q // n):
                at = q // n == c
                sub_s[at], sub_i[at] = self._resolve_pass(d, int(e) * m + int(c), q[at] % n)
            shards[sel], idx[sel] = sub_s, sub_i
        return shards, idx

    def _pass_layout_uncached(self, d: int, e: int):
        sizes = self.shard_sizes[d]
        if self.shuffle:
            order = IndexPermutation(sizes.size, derive_key(self.seed, "shard-order", d, e))(np.arange(sizes.size))
        else:
            order = np.arange(sizes.size)
        ends = np.cumsum(sizes[order])
        return order, ends, ends - sizes[order]

    def _resolve_pass(self, d: int, e: int, p: np.ndarray):
        order, ends, starts = self._pass_layout(d, e)
        if self.shuffle and self.shuffle_block_size is not None:
            p = self._block_permute(d, e, p)
        slot = np.searchsorted(ends, p, side="right")
        shard = order[slot]
        offset = p - starts[slot]
        if self.shuffle and self.shuffle_block_size is None:
            for s in np.unique(shard):
                sel = shard == s
                offset[sel] = self._shard_perm(d, e, int(s))(offset[sel])
        return shard, offset

    def _block_permute(self, d: int, e: int, p: np.ndarray) -> np.ndarray:
        n, bsz = self.sizes[d], self.shuffle_block_size
        block = p // bsz
        out = p.copy()
        for b in np.unique(block):
            sel = block == b
            length = min(bsz, n - int(b) * bsz)
            perm = IndexPermutation(length, derive_key(self.seed, "block", d, e, int(b)))
            out[sel] = int(b) * bsz + perm(p[sel] - int(b) * bsz)
        return out


def _fmt(shares) -> str:
    return "[" + ", ".join(f"{float(x):.4g}" for x in shares) + "]"
