"""The format table: ``{format name: (detect, open)}``, and ``open_dataset`` / ``inspect_source`` over it.

Each format owns its keywords: they are the keyword parameters of its opener (``open_mds``: ``split``,
``validate_hash``, ``allow_unsafe_types``; ``open_energon``: ``split_part``, ``decode``, ...), so a
keyword added to an opener is accepted without touching this module. ``open_dataset`` passes every
format ``name``, ``columns``, ``cache_dir`` and ``on_error``. Every format reads object-storage URLs
(``s3://``, ``msc://``, ``gs://``) through ``remote`` and takes its keywords ``local``, ``download_retry``,
``download_timeout`` and ``cache_limit`` (docs/remote.md).
"""
from __future__ import annotations

import functools
import importlib
import inspect
import os
from typing import Callable, NamedTuple

from .base import Dataset
from .discovery import format_of
from .files import open_files
from .remote import detection_fetcher, is_remote

COMMON_KEYWORDS = ("name", "columns", "cache_dir", "on_error")


class Format(NamedTuple):
    """One entry of ``FORMATS``. Its module is imported on first use of ``detect`` or ``open``: a worker process
    that only reads (its datasets unpickled) never imports a format it does not read (Energon's and MDS's readers
    cost a spawned worker about 0.1 s of start-up).

    module: the module, relative to ``zephon.formats``, holding the functions.
    detect_name: its ``detect(source, fetcher=None) -> bool``, cheap and never raising; None for a file format,
        which is recognised per file by extension instead (so one directory may mix JSONL and Parquet files).
    open_name: its ``open(source, *, name, columns, cache_dir, on_error, **its own keywords) -> Dataset``.
    title: the format's name in messages.
    file_format: the ``format`` keyword given to a file format's opener (``files.open_files``); None: none.
    """
    module: str
    detect_name: str | None
    open_name: str
    title: str
    file_format: str | None = None

    @property
    def detect(self) -> Callable[..., bool] | None:
        return None if self.detect_name is None else getattr(self._module(), self.detect_name)

    @property
    def open(self) -> Callable[..., Dataset]:
        opener = getattr(self._module(), self.open_name)
        return functools.partial(opener, format=self.file_format) if self.file_format else opener

    def _module(self):
        return importlib.import_module(self.module, __package__)


# Detected formats are tried in this order when format=None; nothing detected: files by extension.
FORMATS: dict[str, Format] = {
    "energon": Format(".energon", "is_energon_source", "open_energon", "Energon"),
    "mds": Format(".mds", "is_mds_source", "open_mds", "MDS"),
    "jsonl": Format(".files", None, "open_files", "JSONL", "jsonl"),  # every file as JSON Lines
    "parquet": Format(".files", None, "open_files", "Parquet", "parquet"),
}


def detect_format(source, split: str | None = None, fetcher=None) -> str | None:
    """The first format of ``FORMATS`` whose ``detect`` recognises ``source``; None: files by extension.
    An object-storage URL with a file extension is a file (no request is made to detect it); with a ``split``,
    an object-storage URL is an MDS root (only MDS has splits; listing a bucket to find out would cost more).
    fetcher: the ``remote.Fetcher`` detection requests go through (the dataset's retries and timeout)."""
    if is_remote(source):
        if format_of(os.fspath(source)) is not None:
            return None
        if split is not None:
            return "mds"
    for fmt, entry in FORMATS.items():
        if entry.detect is not None and entry.detect(source, fetcher=fetcher):
            return fmt
    return None


def format_keywords(opener: Callable) -> frozenset[str] | None:
    """The keywords ``opener`` takes besides the source and the common ones; None when it takes any."""
    params = inspect.signature(opener).parameters.values()
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params):
        return None
    return frozenset(p.name for p in params if p.kind is inspect.Parameter.KEYWORD_ONLY) - set(COMMON_KEYWORDS)


def _refusal(fmt: str | None, names: list[str]) -> str:
    parts = []
    for k in names:
        owners = [f for f, e in FORMATS.items() if (kw := format_keywords(e.open)) is None or k in kw]
        titles = " and ".join(FORMATS[f].title for f in owners)
        spelled = " or ".join(repr(f) for f in owners)
        parts.append(f"{k} applies to {titles} datasets only (format={spelled})")
    here = f"format={fmt!r}" if fmt else "these files (JSONL/Parquet by extension)"
    return "; ".join(parts) + f", not to {here}"


def open_dataset(source, *, format: str | None = None, name: str | None = None, columns=None,
                 cache_dir: str | None = None, on_error: str = "raise", **keywords) -> Dataset:
    """Open ``source`` as a Dataset with the opener of its format.

    source: what the format's opener takes: for files a directory, glob, file or list of those (see
        ``files.open_files``); for MDS a dataset directory, split root or index.json (``mds.open_mds``);
        for Energon a prepared dataset root (``energon.open_energon``).
    format: a name in ``FORMATS``, or None: the first format whose ``detect`` recognises ``source``
        (Energon: a root with ``.nv-meta/``; MDS: a streaming ``index.json``), else JSONL/Parquet files by
        extension (one source may mix them).
    name, columns, cache_dir, on_error: for every format (dataset name; columns to return; where caches
        go; "raise" | "skip").
    keywords: the chosen format's own (see its opener). One another format owns is refused with a
        ValueError naming that format, unless it is None or False (the same as not given).

    Raises DataError for bad data (see each opener); ValueError for an unknown format or misplaced
    keyword; TypeError for a keyword no format takes.
    """
    if format is not None and format not in FORMATS:
        raise ValueError(f"format must be one of {tuple(FORMATS)} or None, not {format!r}")
    fmt = format if format is not None else detect_format(source, keywords.get("split"), detection_fetcher(keywords))
    opener = FORMATS[fmt].open if fmt is not None else open_files
    own = format_keywords(opener) if keywords else None  # no keyword to check: no opener need be looked at
    if own is not None:
        owned = [format_keywords(e.open) for e in FORMATS.values()]
        if None not in owned:  # else some format takes any keyword: none is unknown
            unknown = sorted(set(keywords).difference(*owned))
            if unknown:
                raise TypeError(f"open_dataset() got an unexpected keyword argument {unknown[0]!r}")
        misplaced = sorted(k for k, v in keywords.items() if k not in own and v is not None and v is not False)
        if misplaced:
            raise ValueError(_refusal(fmt, misplaced))
        keywords = {k: v for k, v in keywords.items() if k in own}
    return opener(source, name=name, columns=columns, cache_dir=cache_dir, on_error=on_error, **keywords)


def inspect_source(source, **kw) -> dict:
    """Summary for ``zephon inspect PATH``.

    kw: as for ``open_dataset``. Returns ``{"name", "format" ("jsonl" | "parquet" | "mds" | ... | "mixed"),
    "num_shards", "num_samples", "columns", "shards": [{"path", "format", "num_samples",
    "size_bytes", "columns"}, ...]}``. A shard's columns: the requested ones if given, else its Parquet
    schema names, MDS column names or the keys of its first JSONL record; top-level ``columns``: those
    common to every non-empty shard. Raises like ``open_dataset``.
    """
    ds = open_dataset(source, **kw)
    per_shard = [(list(ds.columns) if ds.columns is not None else ds._reader(i).first_keys()) if s.num_samples else []
                 for i, s in enumerate(ds.shards)]
    return {**describe(ds, per_shard),
            "shards": [{"path": s.path, "format": s.format, "num_samples": s.num_samples, "size_bytes": s.size_bytes,
                        "columns": cols} for s, cols in zip(ds.shards, per_shard)]}


def describe(ds, per_shard_columns) -> dict:
    """``{"name", "format" (one format or "mixed"), "num_shards", "num_samples", "columns"}`` of dataset ``ds``;
    ``per_shard_columns``: each shard's column names ([] for an empty or unopened shard). Top-level columns are
    those every non-empty shard has (each shard's own list is reported beside, so disagreeing files show)."""
    formats = sorted({s.format for s in ds.shards})
    non_empty = [c for c in per_shard_columns if c]
    columns = [c for c in non_empty[0] if all(c in other for other in non_empty)] if non_empty else []
    return {"name": ds.name, "format": formats[0] if len(formats) == 1 else "mixed", "num_shards": len(ds.shards),
            "num_samples": ds.num_samples, "columns": columns}
