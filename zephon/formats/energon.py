"""Energon-prepared WebDataset datasets, as prepared by megatron-energon 7.4 ``energon prepare``.

Independent reader of the on-disk format: ``megatron.energon`` and ``webdataset`` are never imported
(the tests use them as the reference). Tar shards and part decoding live in ``wds.py``; this module
reads the ``.nv-meta/`` layer and Metadataset v2 YAML.

Dataset layout (a *dataset root* directory)::

    root/
      data-000.tar  data-000.tar.idx  ...        shards and their offset indexes (see wds.py)
      .nv-meta/.info.json                         {"energon_version": "7.4.1",
                                                   "shard_counts": {"data-000.tar": 5, ...}}
               .info.yaml                         legacy form of the same (read when no .info.json)
               split.yaml (or split.json)         split_parts: {train: [shard names], val: [...], ...}
                                                  exclude: [shard name | "<shard name>/<sample key>", ...]
               dataset.yaml                       sample_type: {__module__, __class__}, field_map: {...},
                                                  subflavors: {...}   (or __class__: CrudeWebdataset,
                                                  part_filter: [parts])
               index.sqlite                       sample keys per shard (used to list keys cheaply)

Shard names in split.yaml and exclude entries are brace-expanded as Energon does (``data-{000..009}.tar``;
no globs: ``energon prepare --split-parts`` regexes are resolved at prepare time). An exclude entry
equal to a shard name drops that shard; an entry ``<shard name>/<sample key>`` drops one sample (Energon
compares it with ``f"{shard name}/{key}"``; a key that is not there is ignored, as in Energon).

YAML is read like Energon's ryml loader: unquoted scalars ``null``/``~`` -> None, ``true``/``yes`` ->
True, ``false``/``no`` -> False, text with a ``.`` or ``e`` -> float if it parses, else int if it
parses, else str; quoted scalars stay strings; mapping keys are strings.

``open_energon`` (reached through ``open_dataset(path, format="energon", split_part=...)``, or
automatically when ``path/.nv-meta`` exists) returns an ``EnergonDataset``: one shard per tar of the
split (in split.yaml order, a shard listed twice appears twice), each with the samples of the tar
minus the excluded keys. ``read(shard, indices)`` gives per sample::

    {"__key__": "s0001",                          # sample key (str)
     "__restore_key__": ["Webdataset", 7],        # what Energon's tar reader puts there: the sample's
                                                  # index over the split's tars *including* excluded samples
     "__shard__": "data-001.tar",                 # shard name as in .info.json (relative to the root)
     "__shard_idx__": 1, "__sample_idx__": 2,     # the (shard, index) that was read
     "__parts__": {"txt": "a caption", "png": tensor(3, H, W)},   # decoded parts (part filter applied)
     "__fields__": {"caption": ..., "image": ...}}                # with a field_map and decode=True: mapped fields

Bad input raises DataError naming the file, shard, sample and key: no ``.nv-meta`` (suggests
``energon prepare``), a bad info/split/dataset YAML, an unknown split part or shard, a tar without its
``.tar.idx`` (suggests ``energon prepare``), an index that does not match the tar or .info.json, a
corrupt member, duplicate keys in a shard, a sample missing a ``field_map`` part, a part that does not
decode. With ``on_error="skip"`` a bad sample reads as ``{"__error__": message}`` (a broken shard gives
that for each sample); errors in ``.nv-meta`` always raise at open time.
"""
from __future__ import annotations

import json
import os
import re
import sqlite3
import string
from itertools import chain, product
from typing import Any, Sequence

import numpy as np

from .base import BrokenShard, Dataset, ShardInfo
from .errors import DataError, per_sample
from .fileio import PreadFile, coalesce_runs
from . import wds

FORMAT = "energon"
MAIN_FOLDER = ".nv-meta"
INFO_JSON = ".info.json"
INFO_YAML = ".info.yaml"
INDEX_SQLITE = "index.sqlite"


# ------------------------------------------------------------------------------------------ YAML


def _cast_scalar(s: str):
    low = s.lower()
    if low in ("null", "~"):
        return None
    if low in ("true", "yes"):
        return True
    if low in ("false", "no"):
        return False
    try:
        if "." in s or "e" in low:
            return float(s)
        return int(s)
    except ValueError:
        return s


def _to_native(node):
    import yaml

    if isinstance(node, yaml.MappingNode):
        return {str(k.value) if isinstance(k, yaml.ScalarNode) else str(_to_native(k)): _to_native(v)
                for k, v in node.value}
    if isinstance(node, yaml.SequenceNode):
        return [_to_native(v) for v in node.value]
    if node.style is not None:  # quoted or block scalar: a string
        return node.value
    return _cast_scalar(node.value)


def load_yaml(data: bytes | str, *, path: str | None = None):
    """Parse YAML the way megatron-energon 7.4's ``eyaml.load_yaml`` (rapidyaml) types scalars (see the
    module docstring). Raises DataError naming ``path`` for invalid YAML."""
    import yaml

    try:
        node = yaml.compose(data, Loader=yaml.SafeLoader)
    except yaml.YAMLError as e:
        raise DataError(f"invalid YAML: {e}", path=path) from None
    return None if node is None else _to_native(node)


def _load_yaml_file(path: str):
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as e:
        raise DataError(f"cannot read: {e.strerror or e}", path=path) from None
    return load_yaml(data, path=path)


def _load_yaml_json_file(path: str):
    if path.endswith(".json"):
        try:
            with open(path, "rb") as f:
                return json.load(f)
        except OSError as e:
            raise DataError(f"cannot read: {e.strerror or e}", path=path) from None
        except ValueError as e:
            raise DataError(f"invalid JSON: {e}", path=path) from None
    if path.endswith(".yaml"):
        return _load_yaml_file(path)
    raise DataError("config file must end in .yaml or .json", path=path)


# ------------------------------------------------------------------------------------------ braces

_INT_RANGE = re.compile(r"^(-?\d+)\.\.(-?\d+)(?:\.\.-?(\d+))?$")
_CHAR_RANGE = re.compile(r"^([A-Za-z])\.\.([A-Za-z])(?:\.\.-?(\d+))?$")
_ALPHABET = string.ascii_uppercase + string.ascii_lowercase
_UNESCAPE = re.compile(r"\\(.)")


def braceexpand(pattern: str) -> list[str]:
    """Bash-style brace expansion with the semantics of the ``braceexpand`` package Energon uses:
    ``{a,b}``, integer ranges ``{07..10}`` (zero padding kept), ``{1..9..2}``, letter ranges ``{a..e}``,
    nesting, ``\\{`` escapes. Raises ValueError for unbalanced braces."""
    return ["".join(_flatten(t)) for t in _parse_pattern(pattern)]


def _flatten(t):
    out = []
    for item in t:
        if isinstance(item, tuple):
            out.extend(_flatten(item))
        else:
            out.append(item)
    return [_UNESCAPE.sub(r"\1", "".join(out))]


def _parse_pattern(pattern: str):
    start = pos = depth = 0
    items = []
    while pos < len(pattern):
        c = pattern[pos]
        if c == "\\":
            pos += 2
            continue
        if c == "{":
            if depth == 0 and pos > start:
                items.append([pattern[start:pos]])
                start = pos
            depth += 1
        elif c == "}":
            depth -= 1
            if depth == 0:
                expr = pattern[start + 1:pos]
                item = _parse_expression(expr)
                if item is None:
                    items.extend([["{"], list(_parse_pattern(expr)), ["}"]])
                else:
                    items.append(list(item))
                start = pos + 1
        pos += 1
    if depth != 0:
        raise ValueError(f"unbalanced braces: {pattern!r}")
    if start < pos:
        items.append([pattern[start:]])
    return product(*items)


def _parse_expression(expr: str):
    m = _INT_RANGE.match(expr)
    if m:
        a, b, step = m.groups()
        pad = max(len(a), len(b)) if any(s.startswith(("0", "-0")) for s in (a, b) if s not in ("0", "-0")) else 0
        step = (int(step) or 1) if step else 1
        ia, ib = int(a), int(b)
        r = range(ia, ib + 1, step) if ia < ib else range(ia, ib - 1, -step)
        return ["%0*d" % (pad, i) for i in r]
    m = _CHAR_RANGE.match(expr)
    if m:
        a, b, step = m.groups()
        step = (int(step) or 1) if step else 1
        ia, ib = _ALPHABET.index(a), _ALPHABET.index(b)
        if ia < ib:
            return list(_ALPHABET[ia:ib + 1:step])
        ib = ib or -len(_ALPHABET)
        return list(_ALPHABET[ia:ib - 1:-step])
    return _parse_sequence(expr)


def _parse_sequence(seq: str):
    start = pos = depth = 0
    items = []
    while pos < len(seq):
        c = seq[pos]
        if c == "\\":
            pos += 2
            continue
        if c == "{":
            depth += 1
        elif c == "}":
            depth -= 1
        elif c == "," and depth == 0:
            items.append(_parse_pattern(seq[start:pos]))
            start = pos + 1
        pos += 1
    if depth != 0 or not items:
        return None
    items.append(_parse_pattern(seq[start:]))
    return chain(*items)


# ------------------------------------------------------------------------------------------ field_map

_FIELD_SPLIT = re.compile(r"^(?P<field_name>[^[\]]+)(?P<access>(?:\[([^[\]]+)])*)$")


def split_field_access(desc: str) -> list[list[str]]:
    """Energon's field_map syntax: ``"jpg,png"`` -> ``[["jpg"], ["png"]]`` (alternatives, first that
    works wins); ``"json[a][0]"`` -> ``[["json", "a", "0"]]`` (part, then keys / list indices)."""
    out = []
    for option in desc.split(","):
        m = _FIELD_SPLIT.match(option)
        if m:
            out.append([m.group("field_name")] + [a.lstrip("[").rstrip("]")
                                                  for a in m.group("access").split("][") if a])
        else:
            out.append([desc])
    return out


def _access(value, path: list[str]):
    for p in path:
        if isinstance(value, dict):
            value = value[p]
        elif isinstance(value, list):
            value = value[int(p)]
        else:
            raise ValueError(f"cannot access {p!r} in a {type(value).__name__}")
    return value


def field_access(sample: dict, options: list[list[str]]):
    """Value of one field_map entry (as Energon's ``field_access``): try each alternative in order;
    KeyError/ValueError/IndexError/TypeError move on to the next; the last one's error propagates."""
    for opt in options[:-1]:
        try:
            return _access(sample, opt)
        except (KeyError, ValueError, IndexError, TypeError):
            pass
    return _access(sample, options[-1])


# ------------------------------------------------------------------------------------------ .nv-meta


def is_energon_source(source) -> bool:
    """True when ``source`` is a directory holding ``.nv-meta/`` (an Energon-prepared dataset root)."""
    if not isinstance(source, (str, os.PathLike)):
        return False
    return os.path.isdir(os.path.join(os.fspath(source), MAIN_FOLDER))


def read_info(root: str) -> dict[str, int]:
    """``shard_counts`` of ``.nv-meta/.info.json`` (or legacy ``.info.yaml``): ``{shard name: samples}``
    in file order. Raises DataError when there is no ``.nv-meta`` or info file (suggesting
    ``energon prepare``) or it is malformed."""
    meta = os.path.join(root, MAIN_FOLDER)
    if not os.path.isdir(meta):
        raise DataError(f"not an Energon-prepared dataset: no {MAIN_FOLDER}/ directory; run `energon prepare "
                        f"{root}` (megatron-energon) to index the tar shards and write the split", path=root)
    jpath, ypath = os.path.join(meta, INFO_JSON), os.path.join(meta, INFO_YAML)
    if os.path.isfile(jpath):
        path = jpath
        obj = _load_yaml_json_file(jpath)
    elif os.path.isfile(ypath):
        path = ypath
        obj = _load_yaml_file(ypath)
    else:
        raise DataError(f"no {INFO_JSON} or {INFO_YAML} in {MAIN_FOLDER}/: run `energon prepare {root}`", path=meta)
    counts = obj.get("shard_counts") if isinstance(obj, dict) else None
    if not isinstance(counts, dict) or not all(
            isinstance(k, str) and isinstance(v, int) and not isinstance(v, bool) and v >= 0 for k, v in counts.items()):
        raise DataError("bad dataset info: expected shard_counts: {shard name: sample count >= 0}", path=path)
    return dict(counts)


def read_split(root: str, split_config: str = "split.yaml") -> tuple[dict[str, list[str]], list[str], str]:
    """``(split_parts, exclude, path)`` of ``.nv-meta/<split_config>`` (falling back to ``split.json``
    for the default name, as Energon does), brace-expanded. Raises DataError when missing or malformed."""
    path = os.path.join(root, MAIN_FOLDER, split_config)
    if not os.path.isfile(path) and split_config == "split.yaml":
        alt = os.path.join(root, MAIN_FOLDER, "split.json")
        if os.path.isfile(alt):
            path = alt
    if not os.path.isfile(path):
        raise DataError(f"no split config {os.path.basename(path)}: run `energon prepare {root}`", path=path)
    obj = _load_yaml_json_file(path)
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
    """The ``energon`` description of ``.nv-meta/<dataset_config>``::

        {"sample_type": {"__module__": ..., "__class__": ...} | None,
         "field_map": {field: part spec} | None, "subflavors": {...},
         "part_filter": list of part names | str (a "module:function" Energon would import) | None,
         "sample_loader": str | None, "crude": bool, "class": "StandardWebdatasetFactory" | "CrudeWebdataset" | ...,
         "image_decode": imagespec from a ``decoder:`` entry or None, "decode": False when ``decoder: null``}

    A missing dataset.yaml gives ``None`` fields and ``crude=False`` (Energon itself needs one to load).
    Raises DataError for a malformed file.
    """
    path = os.path.join(root, MAIN_FOLDER, dataset_config)
    out = {"sample_type": None, "field_map": None, "subflavors": {}, "part_filter": None, "sample_loader": None,
           "crude": False, "class": None, "image_decode": None, "decode": True, "path": None}
    if not os.path.isfile(path):
        return out
    obj = _load_yaml_file(path)
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
    if fm is not None:
        if not isinstance(fm, dict) or not all(isinstance(v, str) for v in fm.values()):
            raise DataError(f"bad dataset config: field_map must map field names to part specs, got {fm!r}", path=path)
        if out["crude"]:
            raise DataError("bad dataset config: CrudeWebdataset takes no field_map", path=path)
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


# ------------------------------------------------------------------------------------------ shards


class _ShardMeta:
    """Static description of one split shard: name, tar path, raw count (.info.json), index of its
    first sample over the split (restore index), position in .info.json (sqlite tar_file_id), and the
    raw indices kept (None = all)."""

    __slots__ = ("name", "path", "raw_count", "global_offset", "info_pos", "kept")

    def __init__(self, name, path, raw_count, global_offset, info_pos, kept=None):
        self.name, self.path, self.raw_count = name, path, raw_count
        self.global_offset, self.info_pos, self.kept = global_offset, info_pos, kept

    @property
    def num_samples(self) -> int:
        return self.raw_count if self.kept is None else len(self.kept)

    def raw_index(self, i: int) -> int:
        return i if self.kept is None else int(self.kept[i])

    def __getstate__(self):
        return {k: getattr(self, k) for k in self.__slots__}

    def __setstate__(self, st):
        for k, v in st.items():
            setattr(self, k, v)


def _sqlite_keys(root: str, meta: _ShardMeta) -> list[str] | None:
    """Sample keys of a shard from ``.nv-meta/index.sqlite`` (written by ``energon prepare``), or None
    when there is no usable table (then the tar headers are read)."""
    db = os.path.join(root, MAIN_FOLDER, INDEX_SQLITE)
    if not os.path.isfile(db):
        return None
    try:
        con = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
        try:
            rows = con.execute("SELECT sample_index, sample_key FROM samples WHERE tar_file_id = ? "
                               "ORDER BY sample_index", (meta.info_pos,)).fetchall()
        finally:
            con.close()
    except sqlite3.Error:
        return None
    if len(rows) != meta.raw_count or any(r[0] != i for i, r in enumerate(rows)):
        return None
    return [r[1] for r in rows]


def _list_keys(root: str, meta: _ShardMeta, off: np.ndarray, pread, shard: int | None) -> tuple[list[str], bool]:
    """``(keys by raw sample index, from_sqlite)``: from index.sqlite when it has this shard, else by
    reading each sample's first header through the .tar.idx offsets (random access, no scan)."""
    keys = _sqlite_keys(root, meta)
    if keys is not None:
        return keys, True
    out = []
    for i in range(meta.raw_count):
        try:
            out.append(wds.sample_key_at(pread, int(off[i]), int(off[i + 1])))
        except ValueError as e:
            raise DataError(f"tar sample {i}: {e}", path=meta.path, shard=shard) from None
    return out, False


class _TarShardReader:
    """Random access to the samples of one tar (one split shard). Thread-safe (pread only)."""

    def __init__(self, ds: "EnergonDataset", shard_id: int):
        meta = ds.metas[shard_id]
        self.meta, self.shard_id = meta, shard_id
        self.part_filter = ds._part_filter
        self.fields = ds._fields
        self.decode, self.image_decode, self.allow_unsafe = ds.decode, ds.image_decode, ds.allow_unsafe_types
        size = os.stat(meta.path).st_size
        self.off = wds.read_tar_index(wds.itar_path(meta.path), size, meta.raw_count, tar_path=meta.path,
                                      shard=shard_id)
        self.pread = PreadFile(meta.path)
        self.keys, _ = _list_keys(ds.root, meta, self.off, self.pread, shard_id)
        first: dict[str, int] = {}
        self.dups: dict[str, list[int]] = {}
        for i, k in enumerate(self.keys):
            j = first.setdefault(k, i)
            if j != i:
                self.dups.setdefault(k, [j]).append(i)

    @property
    def num_samples(self) -> int:
        return self.meta.num_samples

    def first_keys(self) -> list[str]:
        return ["__key__", "__parts__"]

    def _err(self, msg, i, key=None) -> DataError:
        k = f"key {key!r}: " if key is not None else ""
        return DataError(k + msg, path=self.meta.path, shard=self.shard_id, sample=i)

    def read(self, indices: Sequence[int], on_error: str = "raise") -> list[dict]:
        meta = self.meta
        raw_of = {i: meta.raw_index(i) for i in set(indices)}
        wanted = sorted(set(raw_of.values()))
        decoded: dict[int, Any] = {}
        for a, b in coalesce_runs(wanted, self.off):
            lo, hi = int(self.off[a]), int(self.off[b + 1])
            buf = self.pread(hi - lo, lo)
            for r in range(a, b + 1):  # runs hold wanted ids only
                s, e = int(self.off[r]) - lo, int(self.off[r + 1]) - lo
                decoded[r] = (buf[s:e], len(buf) >= e)
        by_raw: dict[int, Any] = {}  # a repeated index is parsed and decoded once

        def read_one(i):
            r = raw_of[i]
            if r not in by_raw:
                by_raw[r] = self._sample(i, r, *decoded[r])
            res = by_raw[r]
            if isinstance(res, DataError):
                raise res
            d = dict(res)
            d["__sample_idx__"] = i
            d["__parts__"] = dict(res["__parts__"])
            return d
        return per_sample(indices, read_one, on_error)

    def _sample(self, i: int, r: int, span: bytes, complete: bool):
        meta = self.meta
        expect = self.keys[r]
        if expect in self.dups:
            return self._err(f"duplicate sample key in this shard (tar samples {self.dups[expect]}); keys must be "
                             f"unique (`energon prepare --fix-duplicates` renames them)", i, expect)
        if not complete:
            return self._err(f"tar truncated: sample bytes [{int(self.off[r])}, {int(self.off[r + 1])}) not all "
                             f"readable", i, expect)
        try:
            key, raw_parts, _names = wds.parse_sample(span, parts_wanted=self.part_filter)
        except ValueError as e:
            return self._err(f"tar sample {r} at byte {int(self.off[r])}: {e}", i, expect)
        if key != expect:
            return self._err(f"tar sample {r} at byte {int(self.off[r])} has key {key!r}, but the index lists "
                             f"{expect!r}: the .tar.idx / index.sqlite do not match the tar; re-run `energon prepare`",
                             i, expect)
        parts = {}
        for p, data in raw_parts.items():
            if not self.decode:
                parts[p] = data
                continue
            try:
                parts[p] = wds.decode_part(p, data, image_decode=self.image_decode,
                                           allow_unsafe_types=self.allow_unsafe)
            except Exception as e:  # any decoder failure is bad data for this sample
                return self._err(f"part {p!r} does not decode: {type(e).__name__}: {e}", i, key)
        rec = {"__key__": key, "__restore_key__": ["Webdataset", meta.global_offset + r], "__shard__": meta.name,
               "__shard_idx__": self.shard_id, "__sample_idx__": i, "__parts__": parts}
        if self.fields is not None:
            view = {**parts, "__key__": key, "__shard__": meta.name,
                    "__restore_key__": ("Webdataset", meta.global_offset + r)}
            fields = {}
            for name, (spec, options) in self.fields.items():
                try:
                    fields[name] = field_access(view, options)
                except (KeyError, ValueError, IndexError, TypeError) as e:
                    missing = [o[0] for o in options if o[0] not in view]
                    why = (f"part {'/'.join(map(repr, missing))} missing" if len(missing) == len(options)
                           else f"cannot access it ({type(e).__name__}: {e})")
                    return self._err(f"field_map field {name!r} = {spec!r}: {why} (sample has parts: "
                                     f"{', '.join(sorted(parts)) or 'none'})", i, key)
            rec["__fields__"] = fields
        return rec

    def close(self):
        self.pread.close()


class EnergonDataset(Dataset):
    """A ``Dataset`` over one split part of an Energon-prepared WebDataset (see the module docstring).

    Attributes: ``root`` (absolute dataset root), ``split_part``, ``metas`` (per shard: name, raw count,
    restore offset, kept raw indices), ``energon`` (from dataset.yaml: ``sample_type``, ``field_map``,
    ``subflavors``, ``part_filter``, ``crude``, ...), ``decode``, ``image_decode``, ``allow_unsafe_types``.
    ``shards[i]`` is a ``ShardInfo`` (tar path, samples after excludes, format "energon", tar size/mtime).
    Picklable: readers are reopened lazily.
    """

    def __init__(self, name, shards, metas, *, root, split_part, energon, on_error="raise", decode=True,
                 image_decode=wds.DEFAULT_IMAGE_DECODE, allow_unsafe_types=False, part_filter=None,
                 n_excluded=0):
        super().__init__(name, shards, on_error=on_error)
        self.metas: tuple[_ShardMeta, ...] = tuple(metas)
        self.root, self.split_part, self.energon = root, split_part, energon
        self.decode, self.image_decode, self.allow_unsafe_types = decode, image_decode, allow_unsafe_types
        self.part_filter = part_filter  # None | frozenset of part names
        self.n_excluded = n_excluded
        self.subset = None  # set by with_subset
        fm = energon.get("field_map")
        # field_map paths such as json[caption] need decoded parts: with decode=False the caller maps them.
        self._fields = ({k: (v, split_field_access(v)) for k, v in fm.items()} if fm and decode else None)

    @property
    def _part_filter(self):
        return self.part_filter

    def __repr__(self):
        return (f"EnergonDataset(name={self.name!r}, split_part={self.split_part!r}, shards={len(self.shards)}, "
                f"num_samples={self.num_samples}, excluded={self.n_excluded}, on_error={self.on_error!r})")

    def _make_reader(self, shard_id: int):
        def open_reader():
            try:
                return _TarShardReader(self, shard_id)
            except OSError as e:
                raise DataError(f"cannot read: {e.strerror or e}", path=self.shards[shard_id].path,
                                shard=shard_id) from None

        return self._open_or_broken(shard_id, open_reader, ["__key__", "__parts__"])

    def fingerprint(self) -> dict:
        """``{"name", "format": "energon", "split_part", "part_filter", "decode", "image_decode",
        "shards": [[shard name, samples kept, raw samples, tar bytes, restore offset], ...]}``."""
        return {
            "name": self.name, "format": FORMAT, "split_part": self.split_part,
            "part_filter": sorted(self.part_filter) if self.part_filter is not None else None,
            "decode": self.decode, "image_decode": self.image_decode,
            "subset": list(self.subset["bounds"]) if self.subset else None,
            "shards": [[m.name, m.num_samples, m.raw_count, s.size_bytes, m.global_offset]
                       for m, s in zip(self.metas, self.shards)],
        }

    def sample_key(self, shard_id: int, index: int) -> str:
        """Key of sample ``index`` of shard ``shard_id`` without reading its data."""
        r = self._reader(shard_id)
        if isinstance(r, BrokenShard):
            raise r.error
        return r.keys[self.metas[shard_id].raw_index(index)]

    def with_subset(self, subset: dict | None) -> "EnergonDataset":
        """This split restricted to a metadataset leaf's ``subset`` (see ``load_metadataset``), as Energon's
        sharder applies it: ``subset_bounds(subset, total)`` over the split's restore indices (excluded
        samples included in ``total``), then excluded samples dropped. Shards left with no samples are
        dropped (shard ids renumber; ``__restore_key__`` stays Energon's). ``None`` returns ``self``."""
        if subset is None:
            return self
        total = sum(m.raw_count for m in self.metas)
        start, end = subset_bounds(subset, total)
        metas, shards = [], []
        for m, s in zip(self.metas, self.shards):
            lo, hi = max(start - m.global_offset, 0), min(end - m.global_offset, m.raw_count)
            if lo >= hi:
                continue
            kept = np.arange(m.raw_count, dtype=np.int64) if m.kept is None else m.kept
            kept = kept[(kept >= lo) & (kept < hi)]
            if not len(kept):
                continue
            nm = _ShardMeta(m.name, m.path, m.raw_count, m.global_offset, m.info_pos,
                            None if len(kept) == m.raw_count else kept)
            metas.append(nm)
            shards.append(ShardInfo(s.path, nm.num_samples, s.format, s.size_bytes, s.mtime_ns))
        if not metas:
            raise DataError(f"subset {subset} [{start}, {end}) leaves no samples", path=self.root)
        ds = EnergonDataset(self.name, shards, metas, root=self.root, split_part=self.split_part, energon=self.energon,
                            on_error=self.on_error, decode=self.decode, image_decode=self.image_decode,
                            allow_unsafe_types=self.allow_unsafe_types, part_filter=self.part_filter,
                            n_excluded=self.n_excluded)
        ds.subset = {"bounds": (start, end), **subset}
        return ds

    def raw_index(self, shard_id: int, index: int) -> int:
        """Index over the split's tars including excluded samples (Energon's restore index, the space
        Energon's ``subset`` ranges apply to) of sample ``index`` of shard ``shard_id``."""
        m = self.metas[shard_id]
        return m.global_offset + m.raw_index(index)


def _resolve_part_filter(energon: dict, part_filter):
    """Energon's part filter: field_map -> the parts it references; crude/sample_loader with a list ->
    that list; a function name (Energon imports it) or no filter -> all parts (None)."""
    if part_filter != "auto":
        return frozenset(part_filter) if part_filter is not None else None
    fm = energon.get("field_map")
    if fm:
        return frozenset(opt[0] for spec in fm.values() for opt in split_field_access(spec))
    pf = energon.get("part_filter")
    if isinstance(pf, list):
        return frozenset(pf)
    return None


def open_energon(source, *, split_part: str = "train", name: str | None = None, on_error: str = "raise",
                 split_config: str = "split.yaml", dataset_config: str = "dataset.yaml", decode: bool | None = None,
                 image_decode: str | None = None, allow_unsafe_types: bool = False, part_filter="auto",
                 columns=None, cache_dir=None) -> EnergonDataset:
    """Open split part ``split_part`` of an Energon-prepared WebDataset root (see the module docstring).

    split_config / dataset_config: file names under ``.nv-meta/`` (Energon's defaults). decode: decode
    parts like Energon's default decoder (default True; False: raw bytes, like Energon with
    ``decoder=None``; dataset.yaml ``decoder: null`` also turns it off). image_decode: webdataset imagespec
    for images (default: dataset.yaml's ``decoder.image_decode``, else ``"torchrgb"``: float32 tensors
    ``(3, H, W)`` in [0, 1]). allow_unsafe_types: decode pickle parts and ``.pth`` with full
    ``torch.load`` (runs arbitrary code). part_filter: ``"auto"`` (Energon's: the parts a field_map
    uses, or the crude ``part_filter`` list; all parts otherwise), None (all parts) or a list of part names.

    Work at open time: reads .nv-meta, stats every tar and checks that its ``.tar.idx`` exists; for a
    shard with ``<shard>/<key>`` excludes, lists its keys (index.sqlite, else one header read per
    sample) to find them. Tar data is read on ``read`` only.

    Raises DataError (always, whatever on_error): no .nv-meta / info file (suggests ``energon prepare``),
    malformed YAML/JSON, unknown split part (naming the ones there), a split shard missing from
    .info.json or from disk, a tar without ``.tar.idx`` (suggests ``energon prepare``), a split with no
    shards left. ValueError for bad arguments.
    """
    if on_error not in ("raise", "skip"):
        raise ValueError(f"on_error must be 'raise' or 'skip', not {on_error!r}")
    if columns is not None:
        raise ValueError("columns do not apply to Energon datasets (samples are dicts of parts; use part_filter)")
    if isinstance(source, (list, tuple)):
        raise ValueError("an Energon dataset is one root directory; open several with several open_dataset calls")
    if not isinstance(split_part, str) or not split_part:
        raise ValueError(f"split_part must be a non-empty string, not {split_part!r}")
    if image_decode is not None and image_decode not in wds.IMAGE_SPECS:
        raise ValueError(f"image_decode must be one of {sorted(wds.IMAGE_SPECS)}, not {image_decode!r}")
    if isinstance(part_filter, str) and part_filter != "auto":
        part_filter = [part_filter]
    root = os.path.abspath(os.fspath(source))
    if not os.path.isdir(root):
        raise DataError("no such directory", path=root)
    counts = read_info(root)
    parts, excludes, split_path = read_split(root, split_config)
    if split_part not in parts:
        raise DataError(f"no split part {split_part!r} (split parts here: {', '.join(sorted(parts)) or 'none'})",
                        path=split_path)
    energon = read_dataset_config(root, dataset_config)
    if decode is None:
        decode = energon["decode"]
    if image_decode is None:
        image_decode = energon["image_decode"] or wds.DEFAULT_IMAGE_DECODE
        if image_decode not in wds.IMAGE_SPECS:
            raise DataError(f"unknown decoder.image_decode {image_decode!r}", path=energon["path"])
    excl = set(excludes)
    sample_excl = {e for e in excl if "/" in e}
    names = [n for n in parts[split_part] if n not in excl]
    if not names:
        raise DataError(f"split part {split_part!r} has no shards (after exclude)", path=split_path)
    info_pos = {n: i for i, n in enumerate(counts)}
    metas, shards = [], []
    offset = 0
    for n in names:
        if n not in counts:
            raise DataError(f"split part {split_part!r} lists shard {n!r}, which .info.json does not know "
                            f"(re-run `energon prepare`)", path=split_path)
        path = os.path.join(root, n)
        try:
            st = os.stat(path)
        except OSError as e:
            raise DataError(f"shard listed in .nv-meta missing: {e.strerror or e}", path=path) from None
        if not os.path.isfile(wds.itar_path(path)):
            raise DataError(f"no tar index {os.path.basename(wds.itar_path(path))} next to the tar: run "
                            f"`energon prepare {root}` (megatron-energon) to index the shards", path=path,
                            shard=len(metas))
        meta = _ShardMeta(n, path, counts[n], offset, info_pos[n])
        offset += counts[n]
        wanted = {e[len(n) + 1:] for e in sample_excl if e.startswith(n + "/")}
        if wanted and meta.raw_count:
            off = wds.read_tar_index(wds.itar_path(path), st.st_size, meta.raw_count, tar_path=path, shard=len(metas))
            pread = PreadFile(path)
            try:
                keys, _ = _list_keys(root, meta, off, pread, len(metas))
            finally:
                pread.close()
            drop = [i for i, k in enumerate(keys) if k in wanted]
            if drop:
                meta.kept = np.setdiff1d(np.arange(meta.raw_count, dtype=np.int64), np.asarray(drop, dtype=np.int64))
        metas.append(meta)
        shards.append(ShardInfo(path, meta.num_samples, FORMAT, st.st_size, st.st_mtime_ns))
    n_excl = sum(m.raw_count - m.num_samples for m in metas)
    if name is None:
        name = os.path.basename(root) + f"/{split_part}"
    return EnergonDataset(name, shards, metas, root=root, split_part=split_part, energon=energon, on_error=on_error,
                          decode=decode, image_decode=image_decode, allow_unsafe_types=allow_unsafe_types,
                          part_filter=_resolve_part_filter(energon, part_filter), n_excluded=n_excl)


# ------------------------------------------------------------------------------------------ metadataset


def _subset_of(spec, where: str) -> dict:
    """Energon ``Subset.as_dataset_subset``: ``range: [a, b]`` with ints (absolute sample indices, end may
    be ``end``) or percent strings (``"25%"``) -> ``{"range": (f0, f1) | None, "absolute_range": (s, e | None) | None}``."""
    rng = spec.get("range") if isinstance(spec, dict) else None
    if not isinstance(rng, list) or len(rng) != 2:
        raise ValueError(f"{where}: subset must be {{range: [start, end]}}, got {spec!r}")

    def conv(v):
        if isinstance(v, int) and not isinstance(v, bool):
            return v
        if not isinstance(v, str):
            raise ValueError(f"{where}: subset range values must be ints, 'end' or percentages like '25%', got {v!r}")
        if v.strip() == "end":
            return None
        if not v.endswith("%"):
            raise ValueError(f"{where}: subset range value {v!r} must be a percentage like '25%'")
        p = float(v.removesuffix("%"))
        if not 0 <= p <= 100:
            raise ValueError(f"{where}: subset percentage {v!r} not in [0%, 100%]")
        return p / 100.0

    start, end = conv(rng[0]), conv(rng[1])
    if isinstance(start, int):
        if not (isinstance(end, int) or end is None):
            raise ValueError(f"{where}: absolute subset start {rng[0]!r} needs an int end or 'end'")
        return {"range": (0, 1), "absolute_range": (start, end)}
    if start is None or not isinstance(end, float):
        raise ValueError(f"{where}: relative subset needs two percentages, got {rng!r}")
    if start > end:
        raise ValueError(f"{where}: subset start {rng[0]!r} > end {rng[1]!r}")
    return {"range": (start, end), "absolute_range": None}


def _merge_subset(own, parent, where: str):
    """Energon ``SubsetRatioMixin._get_subset``: a parent (outer) relative range narrows the child's;
    absolute ranges only at leaves."""
    if parent is not None:
        if parent["absolute_range"] is not None:
            raise ValueError(f"{where}: absolute subset ranges are only allowed for a leaf dataset")
        if own is None:
            return parent
        my = _subset_of(own, where)
        if parent["range"] is None:
            return my
        total = my["range"][1] - my["range"][0]
        return {"range": (my["range"][0] + parent["range"][0] * total, my["range"][0] + parent["range"][1] * total),
                "absolute_range": my["absolute_range"]}
    return _subset_of(own, where) if own is not None else None


def subset_bounds(subset: dict | None, total: int) -> tuple[int, int]:
    """``[start, end)`` sample bounds of a leaf ``subset`` over ``total`` samples (Energon's
    ``DatasetSubset.compute_subset``: the absolute range first, then the relative range of what is
    left, with ``int()`` truncation). The indices are Energon's restore indices over the split
    (excluded samples included; see ``EnergonDataset.raw_index``). Raises ValueError when out of range."""
    start, end = 0, total
    if subset is None:
        return start, end
    if subset.get("absolute_range") is not None:
        start, end = subset["absolute_range"]
        if end is None:
            end = total
        if not 0 <= start <= end <= total:
            raise ValueError(f"subset {subset['absolute_range']} out of range for {total} samples")
    if subset.get("range") is not None:
        prev = end - start
        end = start + int(prev * subset["range"][1])
        start += int(prev * subset["range"][0])
        if not 0 <= start <= end <= total:
            raise ValueError(f"subset {subset['range']} out of range for {total} samples")
    return start, end


def load_metadataset(path, split_part: str = "train") -> list[dict]:
    """Leaves of split ``split_part`` of an Energon Metadataset v2 YAML (``__class__: MetadatasetV2``).

    Returns one dict per leaf dataset, in YAML order::

        {"path": absolute dataset root, "split_part": str (the leaf's own split_part, else the inherited one),
         "weight": float | None       # blend: product over the nesting levels of weight / sum of sibling
                                      # weights (Energon's normalisation); None outside any blend
         "repetitions": int | float | None   # blend_epochized: product of repetitions; None outside
         "subset": None | {"range": (f0, f1) | None, "absolute_range": (start, end | None) | None}
                                      # merged over the levels as Energon merges them; apply with subset_bounds
         "subflavors": {...}          # the metadataset's, inner overridden by outer (Energon's traversal);
                                      # samples get {**dataset.yaml subflavors, **these}
         "shuffle_over_epochs_multiplier": int | None, "dataset_config": str | None, "split_config": str | None}

    Nested metadatasets (a ``path`` ending in ``.yaml``) are followed. Relative paths resolve against the
    YAML's directory. Raises DataError naming the YAML for: not a MetadatasetV2 (v1 ``Metadataset`` files
    are refused), an unknown split, ``join`` (not supported), mixing ``blend`` with ``blend_epochized``,
    bad subsets, a leaf that is not an Energon dataset root.
    """
    path = os.path.abspath(os.fspath(path))
    return _mds_split(path, split_part, inherited_subflavors=None, parent_subset=None, seen=())


def _mds_split(path, split_part, inherited_subflavors, parent_subset, seen):
    if path in seen:
        raise DataError("metadataset includes itself", path=path)
    obj = _load_yaml_file(path)
    if not isinstance(obj, dict) or obj.get("__class__") != "MetadatasetV2":
        raise DataError("not a Metadataset v2 YAML (expected __module__: megatron.energon, __class__: MetadatasetV2)",
                        path=path)
    splits = obj.get("splits")
    if not isinstance(splits, dict) or split_part not in splits:
        have = ", ".join(sorted(splits)) if isinstance(splits, dict) else "none"
        raise DataError(f"no split {split_part!r} in the metadataset (splits: {have})", path=path)
    _leaves, _mode = _mds_node(splits[split_part], path, split_part, inherited_subflavors, parent_subset,
                               seen + (path,), f"splits.{split_part}")
    return _leaves


def _mds_node(node, yaml_path, split_part, inherited_subflavors, parent_subset, seen, where):
    """-> (leaves, blend mode "none" | "weight" | "repetitions")."""
    try:
        if not isinstance(node, dict):
            raise ValueError(f"{where}: expected a mapping, got {node!r}")
        if "join" in node:
            raise ValueError(f"{where}: join metadatasets are not supported")
        if "blend" in node or "blend_epochized" in node:
            epoch = "blend_epochized" in node
            key = "blend_epochized" if epoch else "blend"
            items = node[key]
            if not isinstance(items, list) or not items:
                raise ValueError(f"{where}.{key}: expected a non-empty list")
            subset = _merge_subset(node.get("subset"), parent_subset, where)
            attr = "repetitions" if epoch else "weight"
            ws = []
            for j, it in enumerate(items):
                w = it.get(attr, 1) if isinstance(it, dict) else 1
                if not isinstance(w, (int, float)) or isinstance(w, bool) or w < 0:
                    raise ValueError(f"{where}.{key}[{j}].{attr} must be a number >= 0, got {w!r}")
                ws.append(w)
            total = sum(ws)
            if not epoch and total <= 0:
                raise ValueError(f"{where}.blend: weights sum to 0")
            leaves = []
            for j, (it, w) in enumerate(zip(items, ws)):
                inner, mode = _mds_node(it, yaml_path, split_part, inherited_subflavors, subset, seen,
                                        f"{where}.{key}[{j}]")
                want = "repetitions" if epoch else "weight"
                if mode not in ("none", want):
                    raise ValueError(f"{where}: cannot mix blend with blend_epochized")
                for leaf in inner:
                    if epoch:
                        leaf["repetitions"] = w * (leaf["repetitions"] if mode == want else 1)
                    else:
                        leaf["weight"] = (leaf["weight"] if mode == want else 1.0) * w / total
                    leaves.append(leaf)
            return leaves, ("repetitions" if epoch else "weight")
        if "path" not in node:
            raise ValueError(f"{where}: expected blend, blend_epochized or a dataset reference with path")
        ref_path = node["path"]
        if not isinstance(ref_path, str):
            raise ValueError(f"{where}.path must be a string")
        full = ref_path if os.path.isabs(ref_path) else os.path.join(os.path.dirname(yaml_path), ref_path)
        full = os.path.normpath(full)
        own_sf = node.get("subflavors")
        if own_sf is not None and not isinstance(own_sf, dict):
            raise ValueError(f"{where}.subflavors must be a mapping")
        sf = {**(own_sf or {}), **(inherited_subflavors or {})}
        sp = node.get("split_part") or split_part
        subset = _merge_subset(node.get("subset"), parent_subset, where)
        if os.path.isfile(full) and full.endswith(".yaml"):
            sub = _mds_split_nested(full, sp, sf, subset, seen)
            return sub
        if not is_energon_source(full):
            raise ValueError(f"{where}: {full} is not an Energon-prepared dataset (no {MAIN_FOLDER}/; run "
                             f"`energon prepare`) nor a metadataset .yaml")
        return [{"path": full, "split_part": sp, "weight": None, "repetitions": None, "subset": subset,
                 "subflavors": sf, "shuffle_over_epochs_multiplier": node.get("shuffle_over_epochs_multiplier", 1),
                 "dataset_config": node.get("dataset_config"), "split_config": node.get("split_config")}], "none"
    except ValueError as e:
        if isinstance(e, DataError):
            raise
        raise DataError(str(e), path=yaml_path) from None


def _mds_split_nested(path, split_part, subflavors, subset, seen):
    if path in seen:
        raise DataError("metadataset includes itself", path=path)
    obj = _load_yaml_file(path)
    if not isinstance(obj, dict) or obj.get("__class__") != "MetadatasetV2":
        raise DataError("not a Metadataset v2 YAML (expected __class__: MetadatasetV2)", path=path)
    splits = obj.get("splits")
    if not isinstance(splits, dict) or split_part not in splits:
        raise DataError(f"no split {split_part!r} in the nested metadataset", path=path)
    return _mds_node(splits[split_part], path, split_part, subflavors, subset, seen + (path,), f"splits.{split_part}")
