"""JSONL and Parquet files as a ``Dataset``: one file = one shard, format by extension or forced.

A source may mix both formats (a directory of .jsonl and .parquet files is one dataset). Opening counts
the samples of every file (JSONL line index, Parquet footer), files in parallel.
"""
from __future__ import annotations

import hashlib
import os
import warnings
from concurrent.futures import ThreadPoolExecutor
from typing import Sequence

from .base import MAX_OPEN_READERS, Dataset, ShardInfo
from .discovery import EXTENSIONS, FORMATS, expand_remote, expand_source
from .errors import DataError, DataWarning
from .jsonl import JsonlReader
_OPEN_THREADS = 8       # files indexed concurrently by open_files (numpy/zstd/zlib release the GIL)


def open_reader(path: str, fmt: str, shard_id: int | None, columns: Sequence[str] | None, cache_dir: str | None,
                file=None):
    """A reader of one file: ``JsonlReader`` or ``ParquetReader`` by ``fmt``.

    path: the file. fmt: "jsonl" | "parquet". shard_id: for messages. columns: project records to these.
    cache_dir: fallback location of JSONL index caches. file: a remote object's view (``remote_file``), then
    ``path`` is its URL. Raises DataError naming the file for bad data or an unreadable file.
    """
    try:
        return _reader_class(fmt)(path, shard=shard_id, columns=columns, cache_dir=cache_dir, file=file)
    except OSError as e:
        raise DataError(f"cannot read file: {e.strerror or e}", path=path, shard=shard_id) from e


def _reader_class(fmt: str):
    """The reader class of file format ``fmt``. Parquet's (pyarrow, about 0.05 s to import) is imported by the
    first Parquet file, not by every process that imports Zephon."""
    if fmt == "parquet":
        from .parquet import ParquetReader
        return ParquetReader
    return JsonlReader


def remote_file(info: ShardInfo, where: tuple):
    """How a reader sees remote shard ``info``: Parquet by byte ranges (footer, then the row groups read),
    JSONL through its cached copy (fetched on first use; its line index is built once, beside the copy).
    where: ``(RemoteRoot, path below it, etag)``."""
    root, rel, etag = where
    if info.format == "parquet":
        return root.range_file(info.path, info.size_bytes)
    # a stable mtime per object version keeps the line index valid when an evicted copy is fetched again
    stamp = int(hashlib.sha256(f"{etag}:{info.size_bytes}".encode()).hexdigest()[:8], 16) + 10**9
    return root.cached(rel, info.size_bytes, mtime_ns=stamp * 10**9, etag=etag)


class FileDataset(Dataset):
    """A ``Dataset`` of JSONL and/or Parquet files (``ShardInfo.format`` says which reader reads a shard).

    remote: None, or per shard ``(RemoteRoot, path below it, etag)`` for an object (``shards[i].path`` is then
    its URL) and None for a local file.
    """

    remote: list | None = None

    def _check_unchanged(self, shard_id: int, info: ShardInfo) -> None:
        if self.remote is None or self.remote[shard_id] is None:  # remote: checked by size when fetched
            super()._check_unchanged(shard_id, info)

    def _make_reader(self, shard_id: int):
        """A new reader of shard ``shard_id``; DataError when the file cannot be read or changed since opened."""
        info = self.shards[shard_id]
        if self.remote is not None and self.remote[shard_id] is not None:
            r = open_reader(info.path, info.format, shard_id, self.columns, self.cache_dir,
                            remote_file(info, self.remote[shard_id]))
            if r.num_samples != info.num_samples:
                raise DataError(f"object changed since the dataset was opened (now {r.num_samples} samples, was "
                                f"{info.num_samples})", path=info.path, shard=shard_id)
            return r
        r = open_reader(info.path, info.format, shard_id, self.columns, self.cache_dir)
        size = os.stat(info.path).st_size
        if r.num_samples != info.num_samples or size != info.size_bytes:
            raise DataError(f"file changed since the dataset was opened (now {r.num_samples} samples, {size} bytes; "
                            f"was {info.num_samples} samples, {info.size_bytes} bytes)", path=info.path, shard=shard_id)
        return r


def default_name(source, paths: list[str]) -> str:
    """Dataset name for ``source``: a directory's name, a file's name without its extension, else the
    name of the deepest directory common to ``paths`` (or "dataset")."""
    if isinstance(source, str) and "://" in source and not source.startswith("file://"):
        base = source.rstrip("/").rsplit("/", 1)[-1]
        for ext in sorted(EXTENSIONS, key=len, reverse=True):
            if base.lower().endswith(ext):
                return base[: -len(ext)] or base
        if any(c in source for c in "*?["):
            from .remote import basename, glob_prefix
            return basename(glob_prefix(source)) or "dataset"
        return base
    if isinstance(source, (str, os.PathLike)):
        s = os.path.normpath(os.fspath(source))
        if os.path.isdir(s):
            return os.path.basename(os.path.abspath(s))
        if os.path.isfile(s):
            base = os.path.basename(s)
            for ext in sorted(EXTENSIONS, key=len, reverse=True):
                if base.lower().endswith(ext):
                    return base[: -len(ext)] or base
            return base
    if any("://" in p for p in paths):
        return "dataset"
    common = os.path.commonpath([os.path.dirname(p) for p in paths])
    return os.path.basename(common) or "dataset"


def _expand(source, fmt, remote_kw, cache_dir) -> tuple[list, list]:
    """``(files [(path or URL, format, size or None)], remote [(RemoteRoot, rel, etag) or None])`` of ``source``."""
    from .remote import Fetcher, RemoteRoot, cache_key, is_remote, local_path, relative
    items = [local_path(os.fspath(i)) for i in (source if isinstance(source, (list, tuple)) else [source])]
    remote_items = [i for i in items if is_remote(i)]
    if not remote_items:
        files = [(p, f, None) for p, f in expand_source(source, fmt)]
        return files, [None] * len(files)
    local, kw = remote_kw["local"], {k: v for k, v in remote_kw.items() if k != "local"}
    fetcher = Fetcher(kw["download_retry"], kw["download_timeout"])
    files, where, seen = [], [], set()
    for item in items:
        if not is_remote(item):
            for p, f in expand_source(item, fmt):
                files.append((p, f, None))
                where.append(None)
            continue
        prefix, found = expand_remote(item, fmt, fetcher)
        own = None if local is None else (local if len(remote_items) == 1 else os.path.join(local, cache_key(prefix)))
        root = RemoteRoot(prefix, local=own, cache_dir=cache_dir, **kw)
        for o, f in found:
            if o.url in seen:
                raise DataError("object listed twice in the source", path=o.url)
            seen.add(o.url)
            files.append((o.url, f, o.size))
            where.append((root, relative(o.url, prefix), o.etag))
    return files, where


def open_files(source, *, format: str | None = None, name: str | None = None,
               columns: Sequence[str] | None = None, cache_dir: str | None = None,
               on_error: str = "raise", local: str | None = None, download_retry: int = 2,
               download_timeout: float = 60.0, cache_limit=None) -> FileDataset:
    """Open JSONL and/or Parquet files as one Dataset, counting the samples of every file.

    source: a directory (all supported files in it, recursively, sorted by relative path; hidden files
        skipped), a glob pattern, a single file path, or a list of those (in list order).
    format: "jsonl" | "parquet" | None (by extension: .jsonl/.json/.ndjson[.gz|.zst], .parquet/.pq).
    name: dataset name (default: the directory or file name).
    columns: required columns; records are projected to them. A JSONL record missing one raises
        DataError at read time naming file, shard, sample and column; a Parquet file without one raises
        at open time.
    cache_dir: fallback location of JSONL index caches (see ``index_cache``).
    on_error: "raise" | "skip" (see ``Dataset.read``).
    local, download_retry, download_timeout, cache_limit: for objects at ``s3://`` / ``msc://`` / ``gs://``
        URLs (a URL is an object, a glob or a prefix read as a directory; docs/remote.md): the cache
        directory (default ``<cache_dir>/remote/<hash of the prefix>``), re-attempts and seconds per attempt
        of each request, bytes the cache may hold. Parquet objects are read by byte range (nothing cached);
        JSONL objects are fetched whole into the cache, and their line index is built once beside the copy.

    Raises DataError: no files matched; unknown file type; truncated/corrupt .gz/.zst; unreadable
    Parquet; missing Parquet column; an empty file (with on_error="skip" an empty file becomes a
    shard of 0 samples and a DataWarning is issued instead). ValueError for bad arguments.
    """
    if format is not None and format not in FORMATS:
        raise ValueError(f"format must be one of {FORMATS} or None, not {format!r}")
    if on_error not in ("raise", "skip"):
        raise ValueError(f"on_error must be 'raise' or 'skip', not {on_error!r}")
    if isinstance(columns, str):
        columns = [columns]
    columns = tuple(columns) if columns is not None else None
    files, where = _expand(source, format, {"local": local, "download_retry": download_retry,
                                            "download_timeout": download_timeout, "cache_limit": cache_limit},
                           cache_dir)

    def scan(item):
        shard_id, (path, fmt, size) = item
        if where[shard_id] is not None:
            info = ShardInfo(path, 0, fmt, size, 0)
            reader = open_reader(path, fmt, shard_id, columns, cache_dir, remote_file(info, where[shard_id]))
            return ShardInfo(path, reader.num_samples, fmt, size, 0), reader
        st = os.stat(path)
        reader = open_reader(path, fmt, shard_id, columns, cache_dir)
        return ShardInfo(path, reader.num_samples, fmt, st.st_size, st.st_mtime_ns), reader

    if len(files) == 1:
        results = [scan((0, files[0]))]
    else:
        with ThreadPoolExecutor(min(_OPEN_THREADS, len(files))) as pool:
            results = list(pool.map(scan, enumerate(files)))  # in order: the first bad shard is reported

    shards = []
    for shard_id, (info, _) in enumerate(results):
        if info.num_samples == 0:
            err = DataError("empty file (no samples)", path=info.path, shard=shard_id)
            if on_error != "skip":
                raise err
            warnings.warn(f"{err}; skipped (on_error='skip'), it counts as a shard of 0 samples",
                          DataWarning, stacklevel=3)
        shards.append(info)
    ds = FileDataset(name or default_name(source, [p for p, _, _ in files]), shards,
                     columns=columns, on_error=on_error, cache_dir=cache_dir)
    if any(w is not None for w in where):
        ds.remote = where
    for shard_id, (_, reader) in enumerate(results[:MAX_OPEN_READERS]):
        ds._remember(shard_id, reader)
    return ds
