"""Skipped step ranges: global steps a resume leaves out (a loss spike's bad batches), and the step arithmetic.

A skip ``[a, b]`` is given in the steps training sees when it is added (after the skips before it): steps
``a..b-1`` are not delivered, and step ``a`` delivers what ``b`` would have. The list, in the order the skips were
added, is part of the checkpoint's config summary (``SKIPS_KEY``, absent when empty, so a checkpoint without
skips keeps its bytes) and of nothing else: the fingerprint leaves it out, so a run without skips restores onto
one with them. The stream steps they remove are ``stream_ranges``. See docs/debugging.md.
"""
from __future__ import annotations

SKIPS_KEY = "skips"


def check_skip(skip) -> tuple[int, int]:
    """``skip`` as ``(a, b)``. Raises ``ValueError`` unless it is two integers with ``0 <= a < b``."""
    try:
        a, b = skip
    except (TypeError, ValueError):
        raise ValueError(f"skip_steps must be (first step, end step), got {skip!r}") from None
    if type(a) is not int or type(b) is not int or not 0 <= a < b:
        raise ValueError(f"skip_steps={skip!r}: need integers 0 <= first < end (the steps first..end-1 are skipped)")
    return a, b


def stream_ranges(skips) -> list[tuple[int, int]]:
    """The stream steps ``skips`` remove, as sorted disjoint ``(start, stop)`` ranges (``skips``: ``[a, b]`` pairs
    in the order added, each in the steps training saw then)."""
    ranges: list[tuple[int, int]] = []
    for a, b in skips:
        lo, hi = _to_stream(a, ranges), _to_stream(b - 1, ranges) + 1
        merged = []  # the new range swallows the older ones inside it (they lie between lo and hi)
        for r in ranges:
            if r[1] < lo or r[0] > hi:
                merged.append(r)
            else:
                lo, hi = min(lo, r[0]), max(hi, r[1])
        ranges = sorted(merged + [(lo, hi)])
    return ranges


def _to_stream(step: int, ranges) -> int:
    """The stream step that training step ``step`` delivers, ``ranges`` being ``stream_ranges``."""
    for lo, hi in ranges:
        if step >= lo:
            step += hi - lo
    return step


def stream_step(step: int, skips) -> int:
    """The step of the uninterrupted stream that training step ``step`` delivers under ``skips``."""
    return _to_stream(step, stream_ranges(skips))


def stream_row(row: int, rows_per_lane_step: int, skips) -> int:
    """The lane row of the uninterrupted stream that a lane's training row ``row`` delivers under ``skips``."""
    step, i = divmod(row, rows_per_lane_step)
    return stream_step(step, skips) * rows_per_lane_step + i


def skipped_rows(row: int, rows_per_lane_step: int, skips) -> int:
    """Stream rows a lane has skipped once it delivered ``row`` training rows (those before its last delivered
    row's stream row; 0 before any delivery)."""
    if row == 0:
        return 0
    return stream_row(row - 1, rows_per_lane_step, skips) + 1 - row


def add_skip(skips, skip, step: int) -> list[list[int]]:
    """``skips`` with ``skip`` added for a resume at ``step`` (a checkpoint's). Raises ``ValueError`` for a
    malformed skip or one that starts before ``step`` (those steps were delivered already)."""
    a, b = check_skip(skip)
    if a < step:
        raise ValueError(f"skip_steps=({a}, {b}) starts before the checkpoint's step {step}: steps before {step} "
                         f"were delivered already; resume from a checkpoint at or before step {a}")
    return [list(s) for s in skips] + [[a, b]]


def check_skips(skips) -> list[list[int]]:
    """A summary's skip list, checked (``[[a, b], ...]``). Raises ``ValueError`` naming a malformed entry."""
    if not isinstance(skips, list):
        raise ValueError(f"config {SKIPS_KEY!r} must be a list of [first, end] steps, got {skips!r}")
    for s in skips:
        if not isinstance(s, list):
            raise ValueError(f"config {SKIPS_KEY!r}: entry {s!r} is not a [first, end] list")
        check_skip(s)
    return [list(s) for s in skips]


def skip_in_state(state, skip_steps):
    """A copy of a host's saved state whose Zephon checkpoints (every dict with the checkpoint ``format``, however
    deeply the host nests them: a rank list, a DataLoader's state dict, DCP entries) also skip ``skip_steps``
    (``(a, b)`` or a list of them, in today's step numbers); restoring it through any host skips them, as
    ``Loader.restore(state, skip_steps=...)`` does. Only ``config.skips`` changes (outside the fingerprint and the
    lane digest). Raises ``ValueError`` for a malformed skip, one that starts before a checkpoint's step (naming it)
    or a state holding no checkpoint."""
    from .schema import FORMAT

    many = isinstance(skip_steps, (list, tuple)) and bool(skip_steps) and isinstance(skip_steps[0], (list, tuple))
    ranges = sorted((check_skip(s) for s in (skip_steps if many else [skip_steps])), key=lambda s: -s[0])
    found = []

    def walk(obj):
        if isinstance(obj, dict) and obj.get("format") == FORMAT and isinstance(obj.get("config"), dict):
            skips = check_skips(obj["config"].get(SKIPS_KEY, []))
            for skip in ranges:  # several ranges of one call are all in today's numbers: the last first
                skips = add_skip(skips, skip, checkpoint_step(obj))
            found.append(obj)
            return {**obj, "config": {**obj["config"], SKIPS_KEY: skips}}
        if isinstance(obj, dict):
            return {k: walk(v) for k, v in obj.items()}
        if isinstance(obj, (list, tuple)):
            return type(obj)(walk(v) for v in obj)
        return obj
    out = walk(state)
    if not found:
        raise ValueError("skip_steps: the state holds no Zephon checkpoint (a dict with format "
                         f"{FORMAT!r}) to record the skip in")
    return out


def checkpoint_step(state: dict) -> int:
    """The first step no lane of checkpoint ``state`` has delivered a row of (a ragged checkpoint: the step its
    furthest lane is in), the earliest a skip may start."""
    rps = state.get("rows_per_lane_step") or 1
    rows = [e.get("delivered_rows") for e in state.get("lanes") or [] if isinstance(e, dict)]
    return max([-(-r // rps) for r in rows if type(r) is int] + [state.get("step") or 0])
