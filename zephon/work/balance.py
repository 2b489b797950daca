"""The end of a finite pass split over the lanes by size, so that lanes end their pass together, on whole rows.

Whole rounds give every lane the same number of samples, not the same number of tokens: short documents make
one lane's pass end rows before another's, and every other lane pays padding rows (or drops its last rows) while
it does. When the datasets know their samples' sizes before reading (``Dataset.sample_sizes``: JSONL line
lengths; never MDS, whose sizes only local raw shards know), the last whole rounds and the rest of the pass are
one region cut into one contiguous segment per lane,
in lane order, each segment ending where the running total of the lanes' sizes (whole rounds included) is closest
to its target. The region reaches back as many rounds as it takes for no lane to be above its target before it
(at least the last whole round).
Packed rows (``WorkSource(rows=...)``): the sizes become estimated tokens (a line fitted from bytes to tokens on
``FIT_SAMPLES`` evenly spaced samples run through the tokenizer), the pass is ``n`` rows of ``ROW_FILL`` x
``max_length`` tokens, and lane ``l``'s target is its whole rows' share (``q`` or ``q + 1`` of them, the extra
rows spread evenly over the lanes), never more than ``ROW_LIMIT`` of its rows (a lane past it after the cut
hands its first documents to the lane before, right to left): lanes end on full rows, not on a tenth of one,
and the pass's last step holds only the lanes with an extra row. Without rows each lane's target is an equal
share. A pure function of the config and the data: the same for every dp degree. See docs/concepts.md ("finite passes").
"""
from __future__ import annotations

import numpy as np

#: Passes (or datasets) longer than this (positions, samples) keep the count split: sizing every position costs
#: O(pass) once, and a lane's end-of-pass padding is then a vanishing share of its rows.
BALANCE_LIMIT = 1 << 24
_BLOCK = 1 << 18  # positions resolved at once while summing sizes
#: Packed rows: samples tokenized to fit tokens against bytes, and the fill each lane's rows are planned at (the
#: packer's own slack plus the fit's error; a lane planned at 100% would spill a nearly empty row).
FIT_SAMPLES = 4096
ROW_FILL = 0.997
ROW_LIMIT = 0.999  # a lane's tokens at most this share of its rows: the packer's own slack in its last rows


def size_table(datasets) -> list[tuple[np.ndarray, np.ndarray]] | None:
    """Per dataset ``(flat sizes, shard offsets)``: sample ``i`` of shard ``s`` has ``flat[offsets[s] + i]``
    bytes; None when one shard of one dataset does not know its sizes (then nothing is balanced)."""
    out = []
    for ds in datasets:
        get = getattr(ds, "sample_sizes", None)
        if get is None:
            return None
        parts = []
        for s, n in enumerate(ds.shard_sizes):
            sizes = get(s)
            if sizes is None or len(sizes) != n:
                return None
            parts.append(np.asarray(sizes, dtype=np.int64))
        offsets = np.concatenate([[0], np.cumsum([len(p) for p in parts])]).astype(np.int64)
        out.append((np.concatenate(parts) if parts else np.zeros(0, np.int64), offsets))
    return out


def position_sizes(source, table, start: int, stop: int) -> np.ndarray:
    """Bytes of the samples at global positions ``[start, stop)`` of ``source`` (int64, one per position)."""
    out = np.empty(stop - start, dtype=np.int64)
    for a in range(start, stop, _BLOCK):
        b = min(stop, a + _BLOCK)
        p = source.pointers(0, -1, np.arange(a, b, dtype=np.int64))
        for d in np.unique(p.dataset_ids):
            sel = p.dataset_ids == d
            flat, offsets = table[int(d)]
            out[a - start:b - start][sel] = flat[offsets[p.shard_ids[sel]] + p.sample_idx[sel]]
    return out


def balanced_bounds(source, full: int) -> tuple[int, int, np.ndarray] | None:
    """``(full rounds kept, region start, bounds)`` of the size split, or None when sizes are unknown or the
    pass is past ``BALANCE_LIMIT``. Lane ``l``'s segment of the region is positions ``[start + bounds[l],
    start + bounds[l + 1])`` (``bounds`` has ``canonical_replicas + 1`` entries, from 0 to the region's length).

    source: a finite ``WorkSource``. full: its whole rounds (chunks of every lane) before the last partial one.
    Raises DataError when a dataset's shard cannot be opened to learn its sizes."""
    C, S, total = source.canonical_replicas, source.chunk_size, source.total_positions
    if max(total, sum(source.sizes)) > BALANCE_LIMIT:  # the sizes table holds every sample of every dataset
        return None
    if total < C:
        return None  # fewer positions than lanes: refused elsewhere (checks.check_finite_lanes)
    table = size_table(source.datasets)
    if table is None:
        return None
    sizes = position_sizes(source, table, 0, total)
    weights, limit = np.ones(C), np.full(C, np.inf)
    if getattr(source, "rows", None) is not None:  # packed rows: estimated tokens, targets of whole rows
        sizes, weights = row_targets(source, sizes)
        if sizes.dtype.kind == "f":  # a lane never gets more tokens than its rows hold (a spill: a near-empty row)
            limit = weights * source.rows[0] * ROW_LIMIT
    targets = sizes.sum() * weights / weights.sum()
    # bytes of each lane after each whole round; kept: the most whole rounds (all but the last at most) that leave
    # no lane above its target, so the rest can bring every lane up to it (a huge document reaches back)
    rounds = np.cumsum(sizes[:full * C * S].reshape(full, C, S).sum(axis=2), axis=0)
    kept = int(np.count_nonzero((rounds[:max(full - 1, 0)] <= targets).all(axis=1)))
    start = kept * C * S
    lane_bytes = rounds[kept - 1] if kept else np.zeros(C)
    sizes = sizes[start:]
    cum = np.concatenate([[0], np.cumsum(sizes)])
    bounds, at, n = [0], 0, len(sizes)
    for lane in range(C - 1):  # each lane in turn: its weight's share of what is left (a huge document's lane is
        # over it, and the lanes after it share the rest among themselves)
        left = cum[n] - cum[at] + lane_bytes[lane:].sum()
        want = cum[at] + max(left * weights[lane] / weights[lane:].sum() - lane_bytes[lane], 0)
        k = int(np.clip(np.searchsorted(cum, want), at + 1, n)) if at < n else n
        k -= k > at and (want - cum[k - 1] < cum[k] - want  # the nearer of the two boundaries, unless past the limit
                         or cum[k] - cum[at] + lane_bytes[lane] > limit[lane])
        if not kept:  # no whole round kept: every lane keeps at least one position of the region
            k = min(max(k, at + 1), n - (C - 1 - lane))
        bounds.append(k)
        at = k
    bounds = np.array(bounds + [n], dtype=np.int64)
    if np.isfinite(limit).all():
        _push_back(bounds, cum, lane_bytes, limit, 1 if not kept else 0)
    return kept, start, bounds


def _push_back(bounds: np.ndarray, cum: np.ndarray, lane_bytes: np.ndarray, limit: np.ndarray, least: int) -> None:
    """Right to left, move a lane's first documents to the lane before while it is past its limit (the greedy cut
    leaves each lane's rounding to the next, and the last lane has no next): the excess ends in lanes with room.
    bounds: the region's cuts (changed in place); least: positions each lane keeps."""
    for lane in range(len(limit) - 1, 0, -1):
        total = cum[bounds[lane + 1]] - cum[bounds[lane]] + lane_bytes[lane]
        if total <= limit[lane]:
            continue
        # the fewest first documents whose move brings the lane within its limit (all it can give, at most)
        k = int(np.searchsorted(cum, cum[bounds[lane]] + total - limit[lane], side="left"))
        bounds[lane] = min(max(k, bounds[lane]), bounds[lane + 1] - least)


def row_targets(source, sizes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(estimated tokens per position, rows per lane)`` of a packed finite pass, or ``(sizes, ones)`` when
    the fit fails (no tokens, or fewer rows than lanes).

    source: a finite ``WorkSource`` with ``rows = (tokens per row, tokens_of)``; ``tokens_of(pointers)`` gives
    each pointer's tokens as the packer sees them. sizes: bytes per position of the pass (int64)."""
    C, total = source.canonical_replicas, len(sizes)
    row_tokens, tokens_of = source.rows
    at = np.arange(min(total, FIT_SAMPLES), dtype=np.int64) * total // min(total, FIT_SAMPLES)
    tokens = np.asarray(tokens_of(source.pointers(0, -1, at)), dtype=np.float64)
    design = np.stack([sizes[at].astype(np.float64), np.ones(len(at))], axis=1)
    (slope, offset), *_ = np.linalg.lstsq(design, tokens, rcond=None)  # tokens ~ slope x bytes + offset
    est = np.maximum(slope * sizes + offset, 0.0)
    # rows at ROW_FILL, plus a document of room per lane (its segment ends on a whole document)
    n = int(np.ceil((est.sum() + C * est.mean()) / (row_tokens * ROW_FILL)))
    if n < C or not np.isfinite(est.sum()):
        return sizes, np.ones(C)
    # q rows per lane, the n - q * C extra ones on lanes spread evenly (lane l when floor((l + 1) r / C) steps up)
    q, r = divmod(n, C)
    lanes = np.arange(C + 1)
    return est, q + np.diff(lanes * r // C).astype(np.float64)


def tail_layout(source) -> tuple[int, int, np.ndarray]:
    """``(full rounds, base, bounds)`` of a finite ``source`` (``WorkSource._tail``): by size with
    ``split="size"`` and sizes known, else the rest after the whole rounds split evenly by count."""
    C, S = source.canonical_replicas, source.chunk_size
    full = source.total_positions // (C * S)
    split = balanced_bounds(source, full) if source.split == "size" else None
    if split is None:
        base = full * C * S
        q, r = divmod(source.total_positions - base, C)
        lanes = np.arange(C + 1, dtype=np.int64)
        split = full, base, lanes * q + np.minimum(lanes, r)
    return split
