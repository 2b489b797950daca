"""Mixture schedules: dataset weights as a function of the global step (a data curriculum).

A ``Schedule`` is written per dataset, as Megatron-Energon's proposal (PR #208) writes a blend weight: a
constant, ``{"step": {step: weight, ...}}`` (piecewise constant: the value of the greatest key <= step) or
``{"linear": {step: weight, ...}}`` (interpolated between keys, constant after the last). It is turned into
segments between the union of the keys: on each the datasets' *shares* (weights / their sum) move linearly
from the start values to the values reached at the next key, so the cumulative share of every dataset is a
closed-form piecewise quadratic in the step, exact in rational arithmetic. ``mixture.ScheduledMixture``
allocates stream positions from it; a checkpoint restores into a schedule that equals it up to the step the
checkpoint depends on (``resume_horizon``). See docs/curricula.md.
"""
from __future__ import annotations

import json
import math
from fractions import Fraction

KINDS = ("step", "linear")


def _number(w, where: str) -> Fraction:
    if isinstance(w, str):  # "1/3": an exact fraction as ``to_dict`` writes it
        try:
            w = Fraction(w)
        except ValueError:
            raise ValueError(f"{where}: a weight must be a number, got {w!r}") from None
    if isinstance(w, bool) or not isinstance(w, (int, float, Fraction)) or not math.isfinite(w) or w < 0:
        raise ValueError(f"{where}: a weight must be a finite number >= 0, got {w!r}")
    return Fraction(repr(w)) if isinstance(w, float) else Fraction(w)  # 0.1 means 1/10, as written


def check_weight(spec, where: str = "weight") -> None:
    """Check one dataset's weight spec (a number >= 0, ``{"step": {...}}`` or ``{"linear": {...}}``) on its own
    (a host keyword's check). Raises ``ValueError`` starting with ``where``."""
    _parse_spec(spec, where=where)


def _parse_spec(spec, d: int = 0, where: str | None = None):
    """``(kind, [(step, Fraction weight), ...])`` for dataset ``d``'s weight spec."""
    where = where or f"schedule weight of dataset {d}"
    if not isinstance(spec, dict):
        return "step", [(0, _number(spec, where))]
    if len(spec) != 1 or next(iter(spec)) not in KINDS:
        raise ValueError(f"{where}: expected a number, {{'step': {{step: weight}}}} or {{'linear': {{step: weight}}}}, "
                         f"got {spec!r}")
    kind, points = next(iter(spec.items()))
    if not isinstance(points, dict) or not points:
        raise ValueError(f"{where}: {kind!r} needs a non-empty mapping step -> weight, got {points!r}")
    out = []
    for k, w in points.items():
        try:
            step = int(k)
        except (TypeError, ValueError):
            step = -1
        if step < 0 or (not isinstance(k, int) and str(k).strip() != str(step)):
            raise ValueError(f"{where}: steps must be integers >= 0, got {k!r}")
        out.append((step, _number(w, f"{where} at step {step}")))
    out.sort()
    if len({s for s, _ in out}) != len(out):
        raise ValueError(f"{where}: a step appears twice in {points!r}")
    return kind, out


def _value(kind: str, points, step: int, left: bool = False) -> Fraction:
    """The weight at ``step`` (``left``: just before it, the left limit of a step function)."""
    if kind == "step":
        val = points[0][1]
        for s, w in points:
            if s < step or (s == step and not left):
                val = w
        return val
    if step <= points[0][0]:
        return points[0][1]
    for (s0, w0), (s1, w1) in zip(points, points[1:]):
        if step <= s1:
            return w0 + (w1 - w0) * Fraction(step - s0, s1 - s0)
    return points[-1][1]


def _shares(weights, step: int) -> tuple:
    total = sum(weights)
    if total == 0:
        raise ValueError(f"schedule: every dataset's weight is 0 at step {step}; at least one must be > 0")
    return tuple(w / total for w in weights)


class Schedule:
    """Mixture weights that change with the global step.

    Args:
        weights: one spec per dataset: a number (constant), ``{"step": {step: weight}}`` or
            ``{"linear": {step: weight}}`` (steps: ints >= 0, or their strings as YAML/JSON keys; weights >= 0,
            a 0 keeps a dataset out of a phase). Before its first key a dataset has its first value.
        positions_per_step: mixed-stream positions per global step; default (None) the loader's
            ``global_batch_size`` (exact when one row is one sample; see docs/curricula.md for packing).
        start_step: the global step at which this loader's step 0 falls (a host that starts a new loader per
            epoch passes ``epoch x steps per epoch``); the weights are read from there on.
    Raises ``ValueError`` for a malformed spec or a step where every weight is 0.
    """

    def __init__(self, weights, *, positions_per_step: int | None = None, start_step: int = 0):
        if isinstance(weights, Schedule):
            weights, positions_per_step = weights.spec, positions_per_step or weights.positions_per_step
        weights = list(weights)
        if not weights:
            raise ValueError("a schedule needs at least one dataset")
        if positions_per_step is not None and (not isinstance(positions_per_step, int) or positions_per_step < 1):
            raise ValueError(f"positions_per_step must be an int >= 1 or None, got {positions_per_step!r}")
        if not isinstance(start_step, int) or start_step < 0:
            raise ValueError(f"start_step must be an int >= 0, got {start_step!r}")
        self.spec = weights
        self.positions_per_step = positions_per_step
        self.start_step = start_step
        self.num_datasets = len(weights)
        parsed = [_parse_spec(s, d) for d, s in enumerate(weights)]
        knots = sorted({0} | {s for _, pts in parsed for s, _ in pts})
        #: ``[(start_step, length or None, start shares, end shares)]``: shares (Fractions summing to 1) move
        #: linearly from the start values (at ``start_step``) to the end values (reached at the next start).
        self.segments = []
        for i, a in enumerate(knots):
            start = _shares([_value(k, p, a) for k, p in parsed], a)
            if i + 1 < len(knots):
                b = knots[i + 1]
                end = _shares([_value(k, p, b, left=True) for k, p in parsed], b)
                self.segments.append((a, b - a, start, end))
            else:
                self.segments.append((a, None, start, start))
        if start_step:
            self.segments = self._shifted(start_step)

    def _shifted(self, offset: int) -> list:
        out = []
        for a, n, p0, p1 in self.segments:
            if n is not None and a + n <= offset:
                continue
            if a < offset:  # the segment in progress at ``offset``: cut at the shares reached there
                m = offset - a
                p0 = p0 if n is None else tuple((x * (n - m) + y * m) / n for x, y in zip(p0, p1))
                n = None if n is None else n - m
                a = offset
            out.append((a - offset, n, p0, p1))
        return out

    @classmethod
    def from_dict(cls, d: dict) -> "Schedule":
        """Inverse of ``to_dict``. Raises ``ValueError`` when ``d`` is not a schedule dict."""
        if not isinstance(d, dict) or "weights" not in d:
            raise ValueError(f"not a schedule: expected {{'weights': [...], 'positions_per_step': ...}}, got {d!r}")
        return cls(d["weights"], positions_per_step=d.get("positions_per_step"), start_step=d.get("start_step", 0))

    @classmethod
    def load(cls, path) -> "Schedule":
        """Read a YAML or JSON file: a list of per-dataset specs, or ``{"weights": [...], "positions_per_step":
        n}``. Raises ``ValueError`` naming the file when it is not one."""
        with open(path, encoding="utf-8") as f:
            text = f.read()
        try:
            import yaml
        except ImportError:  # pragma: no cover - yaml ships with the project's extras
            yaml = None
        try:
            obj = yaml.safe_load(text) if yaml is not None else json.loads(text)
        except (ValueError, getattr(yaml, "YAMLError", ValueError)) as e:  # name the file and the parser's position
            raise ValueError(f"{path}: not a valid YAML/JSON schedule: {e}") from None
        try:
            return cls(obj) if isinstance(obj, list) else cls.from_dict(obj)
        except ValueError as e:
            raise ValueError(f"{path}: {e}") from None

    def to_dict(self) -> dict:
        """Plain JSON data (weights as given, step keys as strings; floats kept as written)."""
        def plain(s):
            if isinstance(s, dict):
                kind, pts = next(iter(s.items()))
                return {kind: {str(int(k)): _json_number(w) for k, w in pts.items()}}
            return _json_number(s)
        out = {"weights": [plain(s) for s in self.spec], "positions_per_step": self.positions_per_step}
        return {**out, "start_step": self.start_step} if self.start_step else out

    def shifted(self, steps: int) -> "Schedule":
        """The same schedule read from global step ``start_step + steps`` on (``steps`` >= 0)."""
        return Schedule(self.spec, positions_per_step=self.positions_per_step, start_step=self.start_step + steps)

    def shares(self, step: int) -> tuple:
        """Each dataset's share (Fractions summing to 1) of the positions of step ``step`` (of this loader:
        global step ``start_step + step``)."""
        for a, n, p0, p1 in reversed(self.segments):
            if step >= a:
                if n is None:
                    return p0
                m = step - a
                return tuple((x * (n - m) + y * m) / n for x, y in zip(p0, p1))
        raise ValueError(f"step must be >= 0, got {step}")

    def first_difference(self, other: "Schedule") -> int | None:
        """The first step where ``other`` gives different shares (or positions per step: then 0); None when
        they agree at every step."""
        if (other.num_datasets != self.num_datasets or other.positions_per_step != self.positions_per_step
                or other.start_step != self.start_step):
            return 0
        knots = sorted({a for a, *_ in self.segments} | {a for a, *_ in other.segments})
        for i, a in enumerate(knots):  # on each piece both are linear in the step: two steps decide
            end = knots[i + 1] if i + 1 < len(knots) else None
            for s in (a, a + 1):
                if (end is None or s < end) and self.shares(s) != other.shares(s):
                    return s
        return None

    def __eq__(self, other):
        return isinstance(other, Schedule) and self.to_dict() == other.to_dict()

    def __repr__(self) -> str:
        return f"Schedule({self.spec!r}, positions_per_step={self.positions_per_step!r}, start_step={self.start_step})"


def _json_number(w):
    if isinstance(w, Fraction):
        return w.numerator if w.denominator == 1 else str(w)
    return w


def resume_horizon(mixture, lane_entries, *, flush_span: int, chunk_size: int,
                   canonical_replicas: int) -> int | None:
    """Steps a new schedule must share with ``mixture``'s (a ``ScheduledMixture``) for a checkpoint with
    these lane entries to restore onto it: every step the checkpoint's positions were drawn under.

    Args:
        mixture: the checkpoint's ``ScheduledMixture``.
        lane_entries: checkpoint lane dicts (``sentinel_chunk``, ``sentinel_offset``).
        flush_span: pointers per lane between flush sentinels; chunk_size: pointers per chunk;
        canonical_replicas: lanes (a step takes ``step_size / canonical_replicas`` positions of each).
    Returns the step R (schedules must agree on steps < R) or None when the allocation already depends on the
    schedule's last phase forever (a group of datasets ahead of its target with weight 0 to the end).
    A resume regenerates each lane's span in progress, so the positions up to the end of those spans count;
    and the allocation at a position reads a group's target up to where the group's count reaches it."""
    rps = mixture.step_size // canonical_replicas
    end = max((e["sentinel_chunk"] * chunk_size + e["sentinel_offset"] + flush_span for e in lane_entries),
              default=0)
    horizon = -(-end // rps)
    reach = mixture.reach(horizon * mixture.step_size)
    return None if reach is None else max(horizon, reach)
