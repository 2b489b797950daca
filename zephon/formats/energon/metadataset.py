"""Energon Metadataset v2 YAML (``__class__: MetadatasetV2``): the leaf datasets of one split.

A split is a dataset reference (``path`` to a prepared root or to another metadataset YAML, with optional
``split_part``, ``subset``, ``subflavors``, ...), a weighted ``blend`` or a ``blend_epochized`` (repetitions)
of such nodes, nested freely. ``load_metadataset`` flattens it into leaves carrying what Energon's
``get_datasets`` computes for each: the normalised weight or repetitions product, the merged subset
(``subset.merge_subset``), and the merged subflavors. Apply a leaf's subset with
``open_energon(path, split_part=leaf["split_part"], subset=leaf["subset"])``.
"""
from __future__ import annotations

import os

from ..errors import DataError
from .nvmeta import MAIN_FOLDER, is_energon_source
from .subset import merge_subset
from .yamlio import read_yaml_file


def load_metadataset(path, split_part: str = "train") -> list[dict]:
    """Leaves of split ``split_part`` of an Energon Metadataset v2 YAML, in YAML order.

    path: the metadataset YAML file. split_part: the split to read (``splits.<split_part>``).
    Returns one dict per leaf dataset::

        {"path": absolute dataset root, "split_part": str (the leaf's own split_part, else the inherited one),
         "weight": float | None       # blend: product over the nesting levels of weight / sum of sibling
                                      # weights (Energon's normalisation); None outside any blend
                  | {"step"|"linear": {step: w}}  # a weight schedule (Energon PR #208's keys) in the outermost
                                      # blend: that blend's weights stay raw (a schedule is normalised per
                                      # step by zephon.work.Schedule), inner constant factors multiply in
         "repetitions": int | float | None   # blend_epochized: product of repetitions; None outside
         "subset": None | {"range": (f0, f1) | None, "absolute_range": (start, end | None) | None}
                                      # merged over the levels as Energon merges them; apply with subset_bounds
         "subflavors": {...}          # the metadataset's, inner overridden by outer (Energon's traversal);
                                      # samples get {**dataset.yaml subflavors, **these}
         "shuffle_over_epochs_multiplier": int | None, "dataset_config": str | None, "split_config": str | None}

    Nested metadatasets (a ``path`` ending in ``.yaml``) are followed; relative paths resolve against the
    directory of the YAML that names them.
    A ``join`` node gives one leaf (its primary's path and split part) with ``"join"`` (see ``_join``).
    Raises DataError naming the YAML for: not a MetadatasetV2 (v1 ``Metadataset`` files are refused), an
    unknown split, a join without a joiner or with a subset,
    mixing ``blend`` with ``blend_epochized``, a weight schedule in
    a nested blend or a ``blend_epochized`` (Zephon supports them in the outermost blend), bad weights or
    subsets, a leaf that is neither an Energon dataset root nor a metadataset, a YAML including itself.
    """
    path = os.path.abspath(os.fspath(path))
    leaves, _mode = _split_of(path, split_part, subflavors=None, subset=None, seen=())
    return leaves


def _split_of(path: str, split_part: str, *, subflavors, subset, seen) -> tuple[list[dict], str]:
    """Leaves of ``splits.<split_part>`` of the YAML at ``path`` and its blend mode ("none" | "weight" |
    "repetitions"), with ``subflavors`` / ``subset`` inherited from the including node."""
    if path in seen:
        raise DataError("metadataset includes itself", path=path)
    obj = read_yaml_file(path)
    if not isinstance(obj, dict) or obj.get("__class__") != "MetadatasetV2":
        raise DataError("not a Metadataset v2 YAML (expected __module__: megatron.energon, __class__: MetadatasetV2)",
                        path=path)
    splits = obj.get("splits")
    if not isinstance(splits, dict) or split_part not in splits:
        have = ", ".join(sorted(splits)) if isinstance(splits, dict) else "none"
        what = "the nested metadataset" if seen else "the metadataset"
        raise DataError(f"no split {split_part!r} in {what} (splits: {have})", path=path)
    try:
        return _node(splits[split_part], path, split_part, subflavors, subset, seen + (path,), f"splits.{split_part}")
    except DataError:
        raise
    except ValueError as e:  # node errors carry their YAML location; add the file
        raise DataError(str(e), path=path) from None


def _node(node, yaml_path, split_part, subflavors, parent_subset, seen, where) -> tuple[list[dict], str]:
    """Leaves and blend mode of one node (a blend, a blend_epochized or a dataset reference)."""
    if not isinstance(node, dict):
        raise ValueError(f"{where}: expected a mapping, got {node!r}")
    if "aux" in node:
        raise ValueError(f"{where}.aux: auxiliary datasets are not supported by zephon (no file stores); put the data "
                         f"in the samples' parts, or join a dataset holding it")
    if "join" in node:
        return [_join(node, yaml_path, split_part, subflavors, parent_subset, where)], "none"
    if "blend" in node or "blend_epochized" in node:
        return _blend(node, yaml_path, split_part, subflavors, parent_subset, seen, where)
    if "path" not in node:
        raise ValueError(f"{where}: expected blend, blend_epochized or a dataset reference with path")
    ref_path = node["path"]
    if not isinstance(ref_path, str):
        raise ValueError(f"{where}.path must be a string")
    full = os.path.normpath(ref_path if os.path.isabs(ref_path) else os.path.join(os.path.dirname(yaml_path), ref_path))
    own_sf = node.get("subflavors")
    if own_sf is not None and not isinstance(own_sf, dict):
        raise ValueError(f"{where}.subflavors must be a mapping")
    sf = {**(own_sf or {}), **(subflavors or {})}  # Energon: what the including level sets wins
    sp = node.get("split_part") or split_part
    subset = merge_subset(node.get("subset"), parent_subset, where)
    if os.path.isfile(full) and full.endswith(".yaml"):
        return _split_of(full, sp, subflavors=sf, subset=subset, seen=seen)
    if os.path.isfile(full) and full.endswith(".jsonl"):  # Energon 7.2+: a JSONL file read as crude data
        if subset is not None:
            raise ValueError(f"{where}: a subset of a JSONL dataset is not supported by zephon")
        return [jsonl_leaf(full, sf)], "none"
    if not is_energon_source(full):
        raise ValueError(f"{where}: {full} is not an Energon-prepared dataset (no {MAIN_FOLDER}/; run "
                         f"`energon prepare`) nor a metadataset .yaml")
    return [{"path": full, "split_part": sp, "weight": None, "repetitions": None, "subset": subset,
             "subflavors": sf, "shuffle_over_epochs_multiplier": node.get("shuffle_over_epochs_multiplier", 1),
             "dataset_config": node.get("dataset_config"), "split_config": node.get("split_config")}], "none"


def jsonl_leaf(path: str, subflavors=None) -> dict:
    """The leaf of a JSONL file (Energon 7.2+ reads it whole as crude samples, ignoring split parts)."""
    return {"path": path, "split_part": None, "weight": None, "repetitions": None, "subset": None,
            "subflavors": dict(subflavors or {}), "shuffle_over_epochs_multiplier": 1, "dataset_config": None,
            "split_config": None, "jsonl": True}


def _join(node, yaml_path, split_part, subflavors, parent_subset, where) -> dict:
    """The leaf of a ``join`` node: the primary's leaf fields plus ``"join": {"members": [{"path", "split_part",
    "nonmatch"}], "names": None | [member names] (a dict join), "joiner": the YAML joiner spec}``."""
    join, joiner = node["join"], node.get("joiner")
    if not isinstance(joiner, dict) or "__module__" not in joiner:
        raise ValueError(f"{where}.joiner: a join needs a joiner ({{__module__, __class__}} of a Sample type or "
                         f"{{__module__, __function__}})")
    names = list(join) if isinstance(join, dict) else None
    refs = list(join.values()) if isinstance(join, dict) else join
    if not isinstance(refs, list) or len(refs) < 2:
        raise ValueError(f"{where}.join: expected a list or mapping of at least two dataset references")
    if node.get("subset") is not None or parent_subset is not None:
        raise ValueError(f"{where}: a subset of a join is not supported by zephon; subset the primary dataset's "
                         f"split instead")
    sp = node.get("split_part") or split_part
    members = []
    for j, ref in enumerate(refs):
        w = f"{where}.join[{names[j] if names else j}]"
        if not isinstance(ref, dict) or not isinstance(ref.get("path"), str):
            raise ValueError(f"{w}: expected a dataset reference with path")
        full = os.path.normpath(ref["path"] if os.path.isabs(ref["path"]) else
                                os.path.join(os.path.dirname(yaml_path), ref["path"]))
        if not is_energon_source(full):
            raise ValueError(f"{w}: {full} is not an Energon-prepared dataset (a join takes prepared datasets only)")
        members.append({"path": full, "split_part": ref.get("split_part") or sp,
                        "nonmatch": ref.get("nonmatch", "error")})
    own_sf = node.get("subflavors")
    if own_sf is not None and not isinstance(own_sf, dict):
        raise ValueError(f"{where}.subflavors must be a mapping")
    return {"path": members[0]["path"], "split_part": members[0]["split_part"], "weight": None, "repetitions": None,
            "subset": None, "subflavors": {**(own_sf or {}), **(subflavors or {})},
            "shuffle_over_epochs_multiplier": node.get("shuffle_over_epochs_multiplier", 1),
            "dataset_config": None, "split_config": None,
            "join": {"members": members, "names": names, "joiner": dict(joiner)}}


def _blend(node, yaml_path, split_part, subflavors, parent_subset, seen, where) -> tuple[list[dict], str]:
    """Leaves of a ``blend`` (weights normalised per level, multiplied down) or ``blend_epochized``
    (repetitions multiplied down); the blend's own subset merges into every child's."""
    epoch = "blend_epochized" in node
    key, attr, mode = ("blend_epochized", "repetitions", "repetitions") if epoch else ("blend", "weight", "weight")
    items = node[key]
    if not isinstance(items, list) or not items:
        raise ValueError(f"{where}.{key}: expected a non-empty list")
    subset = merge_subset(node.get("subset"), parent_subset, where)
    ws = _blend_weights(items, key, attr, epoch, where)
    scheduled = any(isinstance(w, dict) for w in ws)
    if scheduled:
        mode, total = "schedule", 1  # raw weights: the schedule normalises them per step
    else:
        total = sum(ws)
    if not epoch and total <= 0:
        raise ValueError(f"{where}.blend: weights sum to 0")
    leaves = []
    for j, (it, w) in enumerate(zip(items, ws)):
        inner, inner_mode = _node(it, yaml_path, split_part, subflavors, subset, seen, f"{where}.{key}[{j}]")
        if inner_mode == "schedule":
            raise ValueError(f"{where}.{key}[{j}]: a weight schedule in a nested blend is not supported; put the "
                             f"schedule in the outermost blend (constant weights may nest below it)")
        if inner_mode not in ("none", mode) and not (scheduled and inner_mode == "weight"):
            raise ValueError(f"{where}: cannot mix blend with blend_epochized")
        for leaf in inner:
            if epoch:
                leaf["repetitions"] = w * (leaf["repetitions"] if inner_mode == mode else 1)
            elif scheduled:
                leaf["weight"] = _scale(w, leaf["weight"] if inner_mode == "weight" else 1.0)
            else:
                leaf["weight"] = (leaf["weight"] if inner_mode == mode else 1.0) * w / total
            leaves.append(leaf)
    return leaves, mode


def _blend_weights(items: list, key: str, attr: str, epoch: bool, where: str) -> list:
    """Each blend child's weight (or repetitions), default 1; a schedule dict is checked, in a ``blend`` only.

    items: the blend's children. key: "blend" | "blend_epochized". attr: "weight" | "repetitions".
    epoch: a ``blend_epochized``. where: the YAML location for errors. Raises ValueError naming the child.
    """
    ws = []
    for j, it in enumerate(items):
        w = it.get(attr, 1) if isinstance(it, dict) else 1
        if isinstance(w, dict) and not epoch:
            w = _schedule_spec(w, f"{where}.{key}[{j}].{attr}")
        elif not isinstance(w, (int, float)) or isinstance(w, bool) or w < 0:
            raise ValueError(f"{where}.{key}[{j}].{attr} must be a number >= 0 (or, in a blend, a schedule "
                             f"{{step: {{...}}}} / {{linear: {{...}}}}), got {w!r}")
        ws.append(w)
    return ws


def _schedule_spec(w: dict, where: str) -> dict:
    """A blend weight schedule as Energon PR #208 writes it: ``{step: {iteration: weight}}`` or ``{linear:
    {iteration: weight}}`` (integer keys >= 0, weights >= 0). Raises ``ValueError`` naming ``where``."""
    if len(w) != 1 or next(iter(w)) not in ("step", "linear") or not isinstance(next(iter(w.values())), dict):
        raise ValueError(f"{where}: a weight schedule is {{step: {{iteration: weight}}}} or {{linear: {{iteration: "
                         f"weight}}}}, got {w!r}")
    kind, pts = next(iter(w.items()))
    out = {}
    for k, v in pts.items():
        step = int(k) if isinstance(k, str) and k.strip().isdigit() else k  # YAML readers may give "0"
        if isinstance(step, bool) or not isinstance(step, int) or step < 0:
            raise ValueError(f"{where}.{kind}: iterations must be integers >= 0, got {k!r}")
        if isinstance(v, bool) or not isinstance(v, (int, float)) or v < 0:
            raise ValueError(f"{where}.{kind}[{k}]: a weight must be a number >= 0, got {v!r}")
        out[step] = v
    if not out:
        raise ValueError(f"{where}.{kind}: no iteration given")
    return {kind: out}


def _scale(w, factor: float):
    """A blend weight (number or schedule) times a constant factor from the blends nested below it."""
    if isinstance(w, dict):
        kind, pts = next(iter(w.items()))
        return {kind: {k: v * factor for k, v in pts.items()}}
    return w * factor
