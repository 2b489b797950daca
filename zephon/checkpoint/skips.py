"""Skipped step ranges: global steps a resume leaves out (a loss spike's bad batches), and the step arithmetic.

A resume's skips are given in the steps training counts in the resumed run: the given steps are taken as a set
(duplicates and overlapping or touching ranges merge, list order is irrelevant), and its maximal runs ``[a, b)``,
lowest first, are skipped one after the other, each counted as training counts steps once the runs below it
(and the checkpoint's own skips) are left out: steps ``a..b-1`` are not delivered and step ``a`` delivers what
``b`` would have. The checkpoint stores the result normalized: the uninterrupted stream's steps they remove, as
sorted, merged ``[start, stop]`` ranges (``SKIPS_KEY`` in its config summary, absent when empty, so a checkpoint
without skips keeps its bytes). The fingerprint leaves them out, so a run without skips restores onto one with
them. See docs/debugging.md.
"""
from __future__ import annotations

from .schema import FORMAT, SKIPS_KEY


def check_skip(skip) -> tuple[int, int]:
    """``skip`` as ``(a, b)``. Raises ``ValueError`` unless it is two integers with ``0 <= a < b``."""
    try:
        a, b = skip
    except (TypeError, ValueError):
        raise ValueError(f"skip_steps must be (first step, end step), got {skip!r}") from None
    if type(a) is not int or type(b) is not int or not 0 <= a < b:
        raise ValueError(f"skip_steps={skip!r}: need integers 0 <= first < end (the steps first..end-1 are skipped)")
    return a, b


def merged(ranges) -> list[tuple[int, int]]:
    """``ranges`` (``(a, b)`` pairs, any order) as sorted disjoint ranges covering the same steps (overlapping or
    touching ones merged)."""
    out: list[tuple[int, int]] = []
    for a, b in sorted(tuple(r) for r in ranges):
        if out and a <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], b))
        else:
            out.append((a, b))
    return out


def stream_ranges(skips) -> list[tuple[int, int]]:
    """The stream steps ``skips`` (a checkpoint's ``config.skips``: stream steps) remove, as sorted disjoint
    ``(start, stop)`` ranges."""
    return merged(skips)


def covers(skips, other) -> bool:
    """Whether ``skips`` remove every stream step ``other`` removes (both a checkpoint's ``config.skips``)."""
    mine = stream_ranges(skips)
    return all(any(c <= a and b <= d for c, d in mine) for a, b in stream_ranges(other))


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


def add_skips(skips, given, step: int) -> list[list[int]]:
    """``skips`` (stream ranges) with the ranges ``given`` added for a resume at ``step`` (a checkpoint's), in
    the resumed run's training steps as the module says; the result normalized. Raises ``ValueError`` for a
    malformed range or one that starts before ``step`` (those steps were delivered already)."""
    ranges = stream_ranges(skips)
    for a, b in merged(check_skip(g) for g in given):  # lowest first: each counted after the ones below it
        if a < step:
            raise ValueError(f"skip_steps=({a}, {b}) starts before the checkpoint's step {step}: steps before "
                             f"{step} were delivered already; resume from a checkpoint at or before step {a}")
        ranges = merged(ranges + [(_to_stream(a, ranges), _to_stream(b - 1, ranges) + 1)])
    return [list(r) for r in ranges]


def check_skips(skips) -> list[list[int]]:
    """A summary's skip list, checked (``[[a, b], ...]``). Raises ``ValueError`` naming a malformed entry."""
    if not isinstance(skips, list):
        raise ValueError(f"config {SKIPS_KEY!r} must be a list of [first, end] steps, got {skips!r}")
    for s in skips:
        if not isinstance(s, list):
            raise ValueError(f"config {SKIPS_KEY!r}: entry {s!r} is not a [first, end] list")
        check_skip(s)
    return [list(r) for r in stream_ranges(skips)]


def skip_in_state(state, skip_steps):
    """A copy of a host's saved state whose Zephon checkpoints (every dict with the checkpoint ``format``, however
    deeply the host nests them: a rank list, a DataLoader's state dict, DCP entries) also skip ``skip_steps``
    (``(a, b)`` or a list of them, in the resumed run's training steps, see the module); restoring it through any
    host skips them, as ``Loader.restore(state, skip_steps=...)`` does. Only ``config.skips`` changes (outside
    the fingerprint and the lane digest). Raises ``ValueError`` for a malformed skip, one that starts before a
    checkpoint's step (naming it) or a state holding no checkpoint."""
    many = isinstance(skip_steps, (list, tuple)) and bool(skip_steps) and isinstance(skip_steps[0], (list, tuple))
    ranges = [check_skip(s) for s in (skip_steps if many else [skip_steps])]
    found = []

    def walk(obj):
        if isinstance(obj, dict) and obj.get("format") == FORMAT and isinstance(obj.get("config"), dict):
            skips = add_skips(check_skips(obj["config"].get(SKIPS_KEY, [])), ranges, checkpoint_step(obj))
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
