"""MDS ``index.json``: finding it, parsing and validating its shard entries, and which file backs a shard.

A dataset directory (or ``<root>/<split>/``) holds ``index.json`` as written by ``streaming.MDSWriter``::

    {"version": 2, "shards": [{"format": "mds", "version": 2, "samples": n,
        "column_names": [...sorted...], "column_encodings": [...], "column_sizes": [int | null, ...],
        "compression": null | "zstd" | "zstd:7" | "gz" | "bz2" | "br" | "snappy" (optionally ":level"),
        "hashes": ["sha1", "xxh64", ...], "size_limit": int | null,
        "raw_data": {"basename": "shard.00000.mds", "bytes": int, "hashes": {algo: hexdigest}},
        "zip_data": null | {"basename": "shard.00000.mds.zstd", "bytes": int, "hashes": {...}}}, ...]}

A compressed shard is the whole raw shard file compressed as one stream (``zip_data``); the writer keeps
only the compressed file. Compression names map onto ``zephon.formats.codecs``.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import Sequence

from ..codecs import mds_codec
from ..errors import DamagedIndexError, DataError, UnsafeDataError
from ..remote import is_remote, probe
from .encodings import UNSAFE_ENCODINGS, column_codec

INDEX_BASENAME = "index.json"
# a folder with index.json is taken for MDS: a damaged index says how to read the folder otherwise
_NOT_MDS = " (a folder with an index.json is read as MDS; if its files are JSON Lines, pass format='jsonl')"
FORMAT = "mds"


@dataclass(frozen=True)
class FileEntry:
    """``raw_data`` / ``zip_data`` of an index entry: basename, size in bytes, ``{algorithm: hexdigest}``."""
    basename: str
    bytes: int
    hashes: dict


@dataclass(frozen=True)
class ShardMeta:
    """One shard of ``index.json`` (validated): everything needed to open and decode it.

    index_path: absolute path of the index.json naming it. column_sizes: fixed byte size per column, or
    None for variable-size columns. compression: e.g. "zstd:7" or None. zip: None when uncompressed.
    """
    index_path: str
    column_names: tuple
    column_encodings: tuple
    column_sizes: tuple
    compression: str | None
    samples: int
    raw: FileEntry
    zip: FileEntry | None

    @property
    def dirname(self) -> str:
        return os.path.dirname(self.index_path)

    @property
    def raw_path(self) -> str:
        return os.path.join(self.dirname, self.raw.basename)

    @property
    def zip_path(self) -> str | None:
        return os.path.join(self.dirname, self.zip.basename) if self.zip else None


def _file_entry(obj, what: str) -> FileEntry:
    if not isinstance(obj, dict):
        raise ValueError(f"{what} must be an object, got {type(obj).__name__}")
    base, size, hashes = obj.get("basename"), obj.get("bytes"), obj.get("hashes", {})
    if not isinstance(base, str) or not base or base in (".", "..") or "/" in base or "\\" in base:
        raise ValueError(f"{what}.basename must be a plain file name, got {base!r}")
    if not isinstance(size, int) or isinstance(size, bool) or size < 0:
        raise ValueError(f"{what}.bytes must be an int >= 0, got {size!r}")
    if hashes is None:
        hashes = {}
    if not isinstance(hashes, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in hashes.items()):
        raise ValueError(f"{what}.hashes must map algorithm names to hex digests, got {hashes!r}")
    return FileEntry(base, size, dict(hashes))


def _check_compression(algo) -> None:
    if algo is None:
        return
    if not isinstance(algo, str):
        raise ValueError(f"compression must be a string or null, got {algo!r}")
    mds_codec(algo)  # ValueError for an unknown family or level


def parse_index(index_path: str, allow_unsafe_types: bool = False,
                columns: Sequence[str] | None = None) -> list[ShardMeta]:
    """Shards of an MDS ``index.json``, validated.

    index_path: path of the index file. allow_unsafe_types: accept ``pkl`` columns. columns: the columns
    that will be decoded (None = all); a ``pkl`` column outside them is never decoded, so it needs no flag.
    Raises DataError naming the index file (and the shard) for unreadable/invalid JSON, a version other
    than 2, a non-MDS shard format, missing or ill-typed fields, an unknown column encoding or
    compression, column sizes that contradict the encodings, and (unless ``allow_unsafe_types``) a
    ``pkl`` column that would be decoded, naming the column and the flag.
    """
    try:
        with open(index_path, "rb") as f:
            obj = json.loads(f.read())
    except OSError as e:
        raise DataError(f"cannot read index: {e.strerror or e}", path=index_path) from None
    except (ValueError, UnicodeDecodeError, RecursionError) as e:
        raise DamagedIndexError(f"bad index.json: not valid JSON ({e}); the file is damaged or truncated: copy it "
                                f"again or rewrite the dataset with streaming.MDSWriter{_NOT_MDS}",
                                path=index_path) from None
    if not isinstance(obj, dict) or not isinstance(obj.get("shards"), list):
        found = (f"an object with keys {sorted(obj)[:10]}" if isinstance(obj, dict)
                 else f"a JSON {type(obj).__name__}")
        raise DamagedIndexError(f"bad index.json: expected an object with a 'shards' list (as streaming.MDSWriter "
                                f"writes), found {found}{_NOT_MDS}", path=index_path)
    if obj.get("version") != 2:
        raise DamagedIndexError(f"bad index.json: version {obj.get('version')!r} (MDS index version 2 expected)",
                                path=index_path)
    metas = []
    for i, s in enumerate(obj["shards"]):
        try:
            metas.append(_parse_shard(index_path, s))
        except (ValueError, TypeError, KeyError) as e:
            raise DamagedIndexError(f"bad index.json entry: {e}", path=index_path, shard=i) from None
        if not allow_unsafe_types:
            for name, enc in zip(metas[-1].column_names, metas[-1].column_encodings):
                if enc in UNSAFE_ENCODINGS and (columns is None or name in columns):
                    raise UnsafeDataError.refuse(f"column {name!r} uses the unsafe encoding {enc!r} (unpickling "
                                                 f"runs arbitrary code)", path=index_path, shard=i)
    return metas


def _parse_columns(s: dict) -> tuple[list, list, list]:
    names, encs, sizes = s.get("column_names"), s.get("column_encodings"), s.get("column_sizes")
    if not (isinstance(names, list) and isinstance(encs, list) and isinstance(sizes, list)):
        raise ValueError("column_names, column_encodings and column_sizes must be lists")
    if not len(names) == len(encs) == len(sizes):
        raise ValueError(f"{len(names)} column_names, {len(encs)} column_encodings, {len(sizes)} column_sizes")
    if not all(isinstance(n, str) for n in names) or len(set(names)) != len(names):
        raise ValueError(f"column_names must be distinct strings, got {names!r}")
    for name, enc, size in zip(names, encs, sizes):
        if not isinstance(enc, str):
            raise ValueError(f"column {name!r}: encoding must be a string, got {enc!r}")
        try:
            _, fixed = column_codec(enc)
        except ValueError as e:
            raise ValueError(f"column {name!r}: {e}") from None
        if size != fixed or isinstance(size, bool):
            has = f"a fixed size of {fixed} bytes" if fixed is not None else "no fixed size (null)"
            raise ValueError(f"column {name!r}: column_sizes says {size!r}, encoding {enc!r} has {has}")
    return names, encs, sizes


def _parse_shard(index_path: str, s) -> ShardMeta:
    if not isinstance(s, dict):
        raise ValueError(f"expected an object, got {type(s).__name__}")
    if s.get("format") != FORMAT:
        raise ValueError(f"shard format {s.get('format')!r} is not supported (only 'mds' shards are read)")
    if s.get("version", 2) != 2:
        raise ValueError(f"shard version {s.get('version')!r} (2 expected)")
    names, encs, sizes = _parse_columns(s)
    samples = s.get("samples")
    if not isinstance(samples, int) or isinstance(samples, bool) or samples < 0:
        raise ValueError(f"samples must be an int >= 0, got {samples!r}")
    compression = s.get("compression")
    _check_compression(compression)
    raw = _file_entry(s.get("raw_data"), "raw_data")
    zip_ = s.get("zip_data")
    zip_ = _file_entry(zip_, "zip_data") if zip_ is not None else None
    if (zip_ is None) != (compression is None):
        raise ValueError(f"compression {compression!r} but zip_data is {'missing' if zip_ is None else 'present'}")
    if zip_ is not None and zip_.basename == raw.basename:
        raise ValueError("raw_data and zip_data name the same file")
    return ShardMeta(index_path, tuple(names), tuple(encs), tuple(sizes), compression, samples, raw, zip_)


def find_index(source, split: str | None = None) -> str:
    """Absolute path of the ``index.json`` of ``source`` and ``split``.

    source: a dataset directory, a root with split directories, or an index.json file. split: the split
    directory under a root, or None. Raises DataError when there is none (for a root whose splits hold
    the indexes, the message lists the splits); ValueError for a list of sources or a split with a file.
    """
    if isinstance(source, (list, tuple)):
        raise ValueError("an MDS dataset is one directory (with its index.json); open several directories "
                         "with several open_dataset calls")
    s = os.path.abspath(os.fspath(source))
    if os.path.isfile(s):
        if split is not None:
            raise ValueError("split applies to a dataset root directory, not to an index file")
        return s
    if not os.path.isdir(s):
        raise DataError("no such file or directory", path=s)
    d = os.path.join(s, split) if split is not None else s
    index = os.path.join(d, INDEX_BASENAME)
    if os.path.isfile(index):
        return index
    have = _splits_of(s)
    if split is not None:
        raise DataError(f"no {INDEX_BASENAME} for split {split!r}"
                        + (f" (splits here: {', '.join(have)})" if have else ""), path=d)
    if have:
        raise DataError(f"no {INDEX_BASENAME} here; this root has splits {', '.join(have)}: pass split=", path=s)
    raise DataError(f"no {INDEX_BASENAME} (not an MDS dataset directory)", path=s)


def _splits_of(root: str) -> list[str]:
    try:
        names = sorted(os.listdir(root))
    except OSError:
        return []
    return [n for n in names if os.path.isfile(os.path.join(root, n, INDEX_BASENAME))]


def is_mds_source(source, split: str | None = None, fetcher=None) -> bool:
    """Whether ``source`` is an MDS dataset, for format auto-detection. Cheap; raises only for a store that
    does not answer (RemoteError naming the URL).

    source: what ``open_dataset`` was given. split: a split name (then True: only MDS has splits).
    fetcher: the ``remote.Fetcher`` of the open (its retries and timeout bound the HEAD of a URL).
    True for a directory (or object-storage URL) holding an ``index.json``, such an index file itself, or a
    root whose split directories hold one. The file's content is not looked at: a damaged index is then
    reported by ``parse_index`` (naming the file and what is wrong) instead of the folder being guessed to be
    JSON Lines.
    """
    if split is not None:
        return True
    if isinstance(source, (list, tuple)):
        return False
    try:
        s = os.fspath(source)
    except TypeError:
        return False
    if is_remote(s):  # one HEAD request: an index.json at the URL
        url = s.rstrip("/")
        return probe(url if url.endswith("/" + INDEX_BASENAME) else url + "/" + INDEX_BASENAME, fetcher)
    if os.path.isdir(s):
        # a root of splits: open_mds then asks for split= (naming them)
        return os.path.exists(os.path.join(s, INDEX_BASENAME)) or bool(_splits_of(s))
    return os.path.basename(s) == INDEX_BASENAME and os.path.isfile(s)


def data_file(meta: ShardMeta) -> str | None:
    """The file a shard is read from: the raw shard when it is present with its indexed size (always
    for an uncompressed shard; for a compressed one, e.g. after ``streaming`` decompressed it), else the
    compressed file when present, else None (missing)."""
    raw = meta.raw_path
    if meta.zip is None:
        return raw if os.path.isfile(raw) else None
    try:
        if os.path.getsize(raw) == meta.raw.bytes:
            return raw
    except OSError:
        pass
    return meta.zip_path if os.path.isfile(meta.zip_path) else None
