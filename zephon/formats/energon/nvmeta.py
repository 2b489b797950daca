"""The ``.nv-meta/`` folder that ``energon prepare`` writes next to the tar shards of a dataset root.

Files read here (megatron-energon 7.4)::

    .nv-meta/.info.json     {"energon_version": ..., "shard_counts": {"data-000.tar": 5, ...}}
             .info.yaml     legacy form of the same (read when there is no .info.json)
             split.yaml     split_parts: {train: [shard names], ...}; exclude: [shard | "<shard>/<key>", ...]
             (split.json)
             dataset.yaml   sample_type + field_map (+ subflavors), or __class__: CrudeWebdataset + part_filter

Shard names and excludes are brace-expanded (``braces.braceexpand``); ``energon prepare --split-parts``
regexes are resolved at prepare time, so there are no globs here. Every malformed file raises DataError
naming it; a missing ``.nv-meta`` suggests ``energon prepare``.
"""
from __future__ import annotations

import os

from ..errors import DamagedIndexError, DataError
from ..remote import is_remote, probe
from .braces import braceexpand
from .fields import split_field_access
from .yamlio import read_config_file, read_yaml_file

MAIN_FOLDER = ".nv-meta"
INFO_JSON = ".info.json"
INFO_YAML = ".info.yaml"
INDEX_SQLITE = "index.sqlite"


def is_energon_source(source, fetcher=None) -> bool:
    """True when ``source`` (a path; anything else gives False) is a directory holding ``.nv-meta/``, or an
    object-storage URL with a ``.nv-meta/.info.json`` (or ``.info.yaml``) object below it (a HEAD request
    through ``fetcher``, the open's ``remote.Fetcher``; raises RemoteError when the store does not answer)."""
    if not isinstance(source, (str, os.PathLike)):
        return False
    s = os.fspath(source)
    if is_remote(s):
        base = s.rstrip("/") + "/" + MAIN_FOLDER + "/"
        return probe(base + INFO_JSON, fetcher) or probe(base + INFO_YAML, fetcher)
    # Existence, not content: a damaged .nv-meta is then reported (read_info) instead of guessed around.
    return os.path.lexists(os.path.join(s, MAIN_FOLDER))


def read_info(root: str) -> dict[str, int]:
    """Sample count per tar of a dataset root, from ``.nv-meta/.info.json`` (or legacy ``.info.yaml``).

    root: dataset root directory.
    Returns ``{shard name relative to root: samples}`` in file order.
    Raises DataError when there is no ``.nv-meta`` or info file (suggesting ``energon prepare``) or it
    is malformed.
    """
    meta = os.path.join(root, MAIN_FOLDER)
    if os.path.lexists(meta) and not os.path.isdir(meta):
        raise DamagedIndexError(f"{MAIN_FOLDER} is not a directory (damaged or half-copied?); run `energon "
                                f"prepare {root}` again or copy the dataset's {MAIN_FOLDER}/ folder back", path=meta)
    if not os.path.isdir(meta):
        raise DataError(f"not an Energon-prepared dataset: no {MAIN_FOLDER}/ directory; run `energon prepare "
                        f"{root}` (megatron-energon) to index the tar shards and write the split", path=root)
    jpath, ypath = os.path.join(meta, INFO_JSON), os.path.join(meta, INFO_YAML)
    if os.path.isfile(jpath):
        path = jpath
        obj = read_config_file(jpath)
    elif os.path.isfile(ypath):
        path = ypath
        obj = read_yaml_file(ypath)
    else:
        raise DataError(f"no {INFO_JSON} or {INFO_YAML} in {MAIN_FOLDER}/: run `energon prepare {root}`", path=meta)
    counts = obj.get("shard_counts") if isinstance(obj, dict) else None
    if not isinstance(counts, dict) or not all(isinstance(k, str) and isinstance(v, int) and not isinstance(v, bool)
                                               and v >= 0 for k, v in counts.items()):
        raise DamagedIndexError("bad dataset info: expected shard_counts: {shard name: sample count >= 0}",
                                path=path)
    return dict(counts)


def read_split(root: str, split_config: str = "split.yaml") -> tuple[dict[str, list[str]], list[str], str]:
    """The split parts and excludes of ``.nv-meta/<split_config>``, brace-expanded.

    root: dataset root directory. split_config: file name under ``.nv-meta/`` (the default falls back to
    ``split.json``, as Energon does).
    Returns ``(split_parts {part: [shard names]}, exclude [shard name | "<shard>/<key>"], path read)``.
    Raises DataError when the file is missing or malformed.
    """
    path = os.path.join(root, MAIN_FOLDER, split_config)
    if not os.path.isfile(path) and split_config == "split.yaml":
        alt = os.path.join(root, MAIN_FOLDER, "split.json")
        if os.path.isfile(alt):
            path = alt
    if not os.path.isfile(path):
        raise DataError(f"no split config {os.path.basename(path)}: run `energon prepare {root}`", path=path)
    obj = read_config_file(path)
    parts = obj.get("split_parts") if isinstance(obj, dict) else None
    if not isinstance(parts, dict) or not all(isinstance(v, list) and all(isinstance(s, str) for s in v)
                                              for v in parts.values()):
        raise DataError("bad split config: expected split_parts: {part: [shard names]}", path=path)
    exclude = obj.get("exclude", [])
    if exclude is None:
        exclude = []
    if not isinstance(exclude, list) or not all(isinstance(s, str) for s in exclude):
        raise DataError("bad split config: exclude must be a list of strings", path=path)
    try:
        expanded = {str(k): [n for pat in v for n in braceexpand(pat)] for k, v in parts.items()}
        excl = [n for pat in exclude for n in braceexpand(pat)]
    except ValueError as e:
        raise DataError(f"bad split config: {e}", path=path) from None
    return expanded, excl, path


def read_dataset_config(root: str, dataset_config: str = "dataset.yaml") -> dict:
    """The sample description of ``.nv-meta/<dataset_config>``.

    root: dataset root directory. dataset_config: file name under ``.nv-meta/``.
    Returns::

        {"sample_type": {"__module__": ..., "__class__": ...} | None,
         "field_map": {field: part spec} | None, "subflavors": {...},
         "part_filter": list of part names | str (a "module:function" Energon would import) | None,
         "sample_loader": str | None, "crude": bool, "class": "StandardWebdatasetFactory" | "CrudeWebdataset" | ...,
         "image_decode": imagespec from a ``decoder:`` entry or None, "decode": False when ``decoder: null``,
         "path": the file read, or None}

    A missing file gives ``None`` fields and ``crude=False`` (Energon itself needs one to load).
    Raises DataError for a malformed file.
    """
    path = os.path.join(root, MAIN_FOLDER, dataset_config)
    out = {"sample_type": None, "field_map": None, "subflavors": {}, "part_filter": None, "sample_loader": None,
           "crude": False, "class": None, "image_decode": None, "decode": True, "path": None}
    if not os.path.isfile(path):
        return out
    obj = read_yaml_file(path)
    if not isinstance(obj, dict):
        raise DataError("bad dataset config: expected a mapping", path=path)
    out["path"] = path
    cls = obj.get("__class__")
    out["class"] = cls if cls is not None else "StandardWebdatasetFactory"
    out["crude"] = cls == "CrudeWebdataset"
    st = obj.get("sample_type")
    if st is not None and not (isinstance(st, dict) and "__class__" in st):
        raise DataError(f"bad dataset config: sample_type must be {{__module__, __class__}}, got {st!r}", path=path)
    out["sample_type"] = st
    fm = obj.get("field_map")
    _check_field_map(fm, out["crude"], path)
    out["field_map"] = fm
    sf = obj.get("subflavors")
    if sf is not None and not isinstance(sf, dict):
        raise DataError(f"bad dataset config: subflavors must be a mapping, got {sf!r}", path=path)
    out["subflavors"] = dict(sf or {})
    pf = obj.get("part_filter")
    if pf is not None and not (isinstance(pf, str) or (isinstance(pf, list) and all(isinstance(p, str) for p in pf))):
        raise DataError(f"bad dataset config: part_filter must be a list of part names or a function name, got {pf!r}",
                        path=path)
    out["part_filter"] = pf
    out["sample_loader"] = obj.get("sample_loader")
    if "decoder" in obj:
        dec = obj["decoder"]
        if dec is None:
            out["decode"] = False
        elif isinstance(dec, dict):
            out["image_decode"] = dec.get("image_decode")
    if fm is None and out["sample_loader"] is None and not out["crude"] and st is not None:
        raise DataError("bad dataset config: needs a field_map or a sample_loader", path=path)
    return out


def _check_field_map(fm, crude: bool, path: str) -> None:
    """Refuse a dataset.yaml ``field_map`` that is not ``{field: part spec}``, or any on a CrudeWebdataset.

    fm: the entry (None: absent). crude: the dataset is a CrudeWebdataset. path: the file, for errors.
    Raises DataError.
    """
    if fm is None:
        return
    if not isinstance(fm, dict) or not all(isinstance(v, str) for v in fm.values()):
        raise DataError(f"bad dataset config: field_map must map field names to part specs, got {fm!r}", path=path)
    if crude:
        raise DataError("bad dataset config: CrudeWebdataset takes no field_map", path=path)


def resolve_part_filter(energon: dict, part_filter) -> frozenset | None:
    """The parts a reader extracts, as Energon's factories filter them.

    energon: ``read_dataset_config`` result. part_filter: ``"auto"`` (Energon's choice: the parts a
    field_map references; a crude/sample_loader dataset's ``part_filter`` list; all parts when it names a
    function Energon would import, or there is none), None (all parts) or an iterable of part names.
    Returns a frozenset of part names, or None for all parts.
    """
    if part_filter != "auto":
        return frozenset(part_filter) if part_filter is not None else None
    fm = energon.get("field_map")
    if fm:
        return frozenset(opt[0] for spec in fm.values() for opt in split_field_access(spec))
    pf = energon.get("part_filter")
    if isinstance(pf, list):
        return frozenset(pf)
    return None
