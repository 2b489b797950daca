"""Metadataset ``subset`` ranges, with megatron-energon 7.4's semantics.

A YAML ``subset: {range: [start, end]}`` (end exclusive) takes either two percentages (``"10%"``, relative
to the dataset) or an absolute sample index start with an int or ``end`` end; absolute ranges are only
allowed at a leaf. Energon turns it into a ``DatasetSubset`` ``{"range": (f0, f1), "absolute_range":
(start, end | None) | None}`` (an absolute range comes with ``range (0, 1)``); an outer (parent) relative
range is composed into the inner one (outer ``[0%, 50%]`` over inner ``[25%, 75%]`` is ``[25%, 50%]``),
and is applied after the leaf's absolute range (outer ``[0%, 50%]`` over ``[0, 1000]`` is ``[0, 500)``).
At a leaf the range applies to the samples of its split part, counted over the split's tars *including*
excluded samples (Energon filters excludes after slicing); see ``subset_bounds``.
"""
from __future__ import annotations


def parse_subset(spec, where: str) -> dict:
    """Energon's ``Subset.as_dataset_subset`` of one YAML ``subset`` entry.

    spec: ``{"range": [start, end]}``; values are ints (absolute sample indices; ``end`` may be ``"end"``)
    or percentage strings like ``"25%"`` (both ends then).
    where: location named in errors (e.g. ``"splits.train.blend[0]"``).
    Returns ``{"range": (f0, f1), "absolute_range": (start, end | None) | None}`` (fractions in [0, 1]).
    Raises ValueError naming ``where`` for any other shape, mixed kinds, a percentage outside [0%, 100%],
    or start > end.
    """
    rng = spec.get("range") if isinstance(spec, dict) else None
    if not isinstance(rng, list) or len(rng) != 2:
        raise ValueError(f"{where}: subset must be {{range: [start, end]}}, got {spec!r}")
    start, end = _range_value(rng[0], where), _range_value(rng[1], where)
    if isinstance(start, int):
        if not (isinstance(end, int) or end is None):
            raise ValueError(f"{where}: absolute subset start {rng[0]!r} needs an int end or 'end'")
        if end is not None and not 0 <= start <= end:
            raise ValueError(f"{where}: absolute subset range {rng!r} needs 0 <= start <= end")
        return {"range": (0, 1), "absolute_range": (start, end)}
    if start is None or not isinstance(end, float):
        raise ValueError(f"{where}: relative subset needs two percentages, got {rng!r}")
    if start > end:
        raise ValueError(f"{where}: subset start {rng[0]!r} > end {rng[1]!r}")
    return {"range": (start, end), "absolute_range": None}


def _range_value(v, where: str):
    """One end of a YAML subset range: an int (absolute index), None (``"end"``) or a fraction in [0, 1].

    v: the YAML value (int, ``"end"`` or a percentage string like ``"25%"``). where: location named in errors.
    Raises ValueError naming ``where`` for any other value or a percentage outside [0%, 100%].
    """
    if isinstance(v, int) and not isinstance(v, bool):
        return v
    if not isinstance(v, str):
        raise ValueError(f"{where}: subset range values must be ints, 'end' or percentages like '25%', got {v!r}")
    if v.strip() == "end":
        return None
    if not v.endswith("%"):
        raise ValueError(f"{where}: subset range value {v!r} must be a percentage like '25%'")
    try:
        p = float(v.removesuffix("%"))
    except ValueError:
        raise ValueError(f"{where}: subset range value {v!r} is not a percentage like '25%'") from None
    if not 0 <= p <= 100:
        raise ValueError(f"{where}: subset percentage {v!r} not in [0%, 100%]")
    return p / 100.0


def merge_subset(own, parent: dict | None, where: str) -> dict | None:
    """The subset a node passes down, as Energon's ``SubsetRatioMixin._get_subset`` computes it.

    own: the node's YAML ``subset`` entry or None. parent: the merged subset coming from the enclosing
    nodes (``parse_subset`` shape) or None. where: location named in errors.
    Returns the merged subset (``parse_subset`` shape), or None when neither level has one.
    Raises ValueError when the parent carries an absolute range (only a leaf may) or ``own`` is malformed.
    """
    if parent is None:
        return parse_subset(own, where) if own is not None else None
    if parent["absolute_range"] is not None:
        raise ValueError(f"{where}: absolute subset ranges are only allowed for a leaf dataset")
    if own is None:
        return parent
    mine = parse_subset(own, where)
    if parent["range"] is None:
        return mine
    # The parent's fractions apply within the range this level already selected (outer within inner).
    width = mine["range"][1] - mine["range"][0]
    return {"range": (mine["range"][0] + parent["range"][0] * width, mine["range"][0] + parent["range"][1] * width),
            "absolute_range": mine["absolute_range"]}


def as_subset(subset) -> dict | None:
    """Either subset form -> the merged form (``parse_subset`` shape).

    subset: None; a merged subset (a dict with an ``absolute_range`` key, as ``load_metadataset`` gives
    per leaf); or a YAML entry ``{"range": [start, end]}`` (ints / ``"end"`` / ``"25%"``).
    Raises ValueError for a malformed subset.
    """
    if subset is None:
        return None
    if isinstance(subset, dict) and "absolute_range" in subset:
        rng, absolute = subset.get("range"), subset["absolute_range"]
        if rng is not None and not (len(rng) == 2 and 0 <= rng[0] <= rng[1] <= 1):
            raise ValueError(f"subset range {rng!r} must be two fractions 0 <= start <= end <= 1")
        if absolute is not None and not (len(absolute) == 2 and isinstance(absolute[0], int)
                                         and (absolute[1] is None or isinstance(absolute[1], int))):
            raise ValueError(f"subset absolute_range {absolute!r} must be (start, end | None) sample indices")
        return {"range": None if rng is None else tuple(rng),
                "absolute_range": None if absolute is None else tuple(absolute)}
    return parse_subset(subset, "subset")


def subset_bounds(subset: dict | None, total: int) -> tuple[int, int]:
    """``[start, end)`` sample bounds of a leaf's merged subset, as Energon's ``DatasetSubset.compute_subset``.

    subset: merged subset (``parse_subset`` shape) or None (everything).
    total: samples of the leaf's split part over its tars, excluded samples included (Energon's restore
    index space; see ``PreparedWebdataset.raw_index``).
    The absolute range applies first (``end`` None = ``total``), then the relative range within what it
    left, each bound truncated with ``int()``.
    Raises ValueError when a bound falls outside ``[0, total]`` or start > end.
    """
    start, end = 0, total
    if subset is None:
        return start, end
    if subset.get("absolute_range") is not None:
        start, end = subset["absolute_range"]
        if end is None:
            end = total
        if not 0 <= start <= end <= total:
            raise ValueError(f"subset {list(subset['absolute_range'])} out of range for {total} samples")
    if subset.get("range") is not None:
        prev = end - start
        end = start + int(prev * subset["range"][1])
        start += int(prev * subset["range"][0])
        if not 0 <= start <= end <= total:
            raise ValueError(f"subset {list(subset['range'])} out of range for {total} samples")
    return start, end
