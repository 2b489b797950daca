"""Datasets: ordered lists of shards (one file = one shard) with sample counts, and random access."""
from __future__ import annotations

import os
import threading
import warnings
from collections import OrderedDict
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Sequence

from .discovery import EXTENSIONS, FORMATS, expand_source
from .errors import DataError, DataWarning
from .jsonl import JsonlReader
from .parquet import ParquetReader

READERS = {"jsonl": JsonlReader, "parquet": ParquetReader}
MAX_OPEN_READERS = 64   # per Dataset: bounds open file descriptors and index arrays held in memory
_OPEN_THREADS = 8       # files indexed concurrently by open_dataset (numpy/zstd/zlib release the GIL)


@dataclass(frozen=True)
class ShardInfo:
    """One file of a dataset.

    path: absolute path. num_samples: samples (JSONL non-blank lines / Parquet rows).
    format: "jsonl", "parquet", "mds" (or another registered reader's name). size_bytes: file size on
    disk (compressed size for .gz/.zst).
    mtime_ns: modification time when opened (to detect a file changed under a running loader; not part
    of the fingerprint, so copies of the data stay valid).
    """
    path: str
    num_samples: int
    format: str
    size_bytes: int
    mtime_ns: int = 0


class Dataset:
    """A list of shards with sample counts, read by ``(shard_id, sample indices)``.

    Picklable: it holds names, paths and options only; readers are opened lazily (at most
    ``MAX_OPEN_READERS`` at a time) and reopened after unpickling, e.g. in a spawned worker process.
    Thread-safe: readers may be shared by threads.
    Built by ``open_dataset``; the constructor does no I/O and trusts the given ShardInfo.
    """

    def __init__(self, name: str, shards: Sequence[ShardInfo], *, columns: Sequence[str] | None = None,
                 on_error: str = "raise", cache_dir: str | None = None):
        if on_error not in ("raise", "skip"):
            raise ValueError(f"on_error must be 'raise' or 'skip', not {on_error!r}")
        self.name = name
        self.shards: tuple[ShardInfo, ...] = tuple(shards)
        self.columns: tuple[str, ...] | None = tuple(columns) if columns is not None else None
        self.on_error = on_error
        self.cache_dir = cache_dir
        self._init_runtime()

    def _init_runtime(self):
        self._readers: OrderedDict[int, object] = OrderedDict()
        self._lock = threading.Lock()

    def __getstate__(self):
        state = self.__dict__.copy()
        del state["_readers"], state["_lock"]
        return state

    def __setstate__(self, state):
        self.__dict__.update(state)
        self._init_runtime()

    def __repr__(self):
        return (f"Dataset(name={self.name!r}, shards={len(self.shards)}, num_samples={self.num_samples}, "
                f"columns={self.columns!r}, on_error={self.on_error!r})")

    @property
    def num_samples(self) -> int:
        """Total samples over all shards."""
        return sum(s.num_samples for s in self.shards)

    @property
    def shard_sizes(self) -> list[int]:
        """Samples per shard, in shard order."""
        return [s.num_samples for s in self.shards]

    def read(self, shard_id: int, indices: Sequence[int]) -> list[dict]:
        """Records of shard ``shard_id`` at sample ``indices``, in the order given.

        indices: ints in ``[0, shard_sizes[shard_id])``; may repeat (each occurrence gets its own
        dict) and be unsorted. Returns one dict (column -> Python value) per index, projected to
        ``columns`` when those were given. Raises IndexError for an out-of-range shard or sample id
        (a caller bug, not bad data) and DataError naming path, shard and sample for bad data; with
        ``on_error="skip"`` a bad sample comes back as ``{"__error__": str(the DataError)}`` instead.
        """
        if not 0 <= shard_id < len(self.shards):
            raise IndexError(f"dataset {self.name!r}: shard {shard_id} out of range [0, {len(self.shards)})")
        info = self.shards[shard_id]
        indices = [int(i) for i in indices]
        for i in indices:
            if not 0 <= i < info.num_samples:
                raise IndexError(f"{info.path} (shard {shard_id}): sample {i} out of range [0, {info.num_samples})")
        if not indices:
            return []
        self._check_unchanged(shard_id, info)
        return self._reader(shard_id).read(indices, self.on_error)

    def _check_unchanged(self, shard_id: int, info: ShardInfo) -> None:
        # One stat per read call: offsets and counts were computed from the file as it was when opened.
        try:
            st = os.stat(info.path)
        except OSError as e:
            raise DataError(f"cannot read: {e.strerror or e}", path=info.path, shard=shard_id) from None
        if st.st_size != info.size_bytes or (info.mtime_ns and st.st_mtime_ns != info.mtime_ns):
            raise DataError(f"file changed since the dataset was opened (size {info.size_bytes} -> {st.st_size} "
                            f"bytes, mtime changed); reopen it with open_dataset", path=info.path, shard=shard_id)

    def _reader(self, shard_id: int):
        """The reader of shard ``shard_id``: cached (least recently used dropped past ``MAX_OPEN_READERS``),
        else built by ``_make_reader``. Two threads missing at once may both build one; the last is kept."""
        with self._lock:
            r = self._readers.get(shard_id)
            if r is not None:
                self._readers.move_to_end(shard_id)
                return r
        r = self._make_reader(shard_id)
        self._remember(shard_id, r)
        return r

    def _make_reader(self, shard_id: int):
        """A new reader of shard ``shard_id`` (subclasses override this to say how theirs are built).
        Raises DataError when the file cannot be read or changed since the dataset was opened."""
        info = self.shards[shard_id]
        r = _open_reader(info.path, info.format, shard_id, self.columns, self.cache_dir)
        size = os.stat(info.path).st_size
        if r.num_samples != info.num_samples or size != info.size_bytes:
            raise DataError(f"file changed since the dataset was opened (now {r.num_samples} samples, {size} bytes; "
                            f"was {info.num_samples} samples, {info.size_bytes} bytes)", path=info.path, shard=shard_id)
        return r

    def _open_or_broken(self, shard_id: int, open_reader, keys: Sequence[str]):
        """``open_reader()`` (a new reader of shard ``shard_id``); with ``on_error="skip"`` a DataError
        raised by it gives a ``BrokenShard`` (``first_keys()`` = ``keys``) instead of propagating."""
        try:
            return open_reader()
        except DataError as e:
            if self.on_error != "skip":
                raise
            return BrokenShard(e, self.shards[shard_id].num_samples, keys)

    def _remember(self, shard_id: int, reader) -> None:
        # Evicted readers are dropped, not closed: another thread may still be reading with one;
        # they close their files when garbage-collected.
        with self._lock:
            self._readers[shard_id] = reader
            self._readers.move_to_end(shard_id)
            while len(self._readers) > MAX_OPEN_READERS:
                self._readers.popitem(last=False)

    def fingerprint(self) -> dict:
        """JSON-serialisable identity of the content: ``{"name", "columns", "shards": [[basename,
        num_samples, size_bytes], ...]}``. No mtimes or absolute paths, so copying the data elsewhere
        keeps checkpoints valid."""
        return {
            "name": self.name,
            "columns": list(self.columns) if self.columns is not None else None,
            "shards": [[os.path.basename(s.path), s.num_samples, s.size_bytes] for s in self.shards],
        }


class BrokenShard:
    """Stands in for a shard that cannot be opened when ``on_error="skip"``: every sample reads as
    ``{"__error__": ...}`` naming the file, shard and sample; with "raise" reading raises ``error``.

    error: the DataError from opening it. num_samples: its sample count from the dataset's index.
    keys: what ``first_keys()`` reports (for ``inspect``).
    """

    def __init__(self, error: DataError, num_samples: int, keys: Sequence[str]):
        self.error, self._n, self._keys = error, num_samples, list(keys)

    @property
    def num_samples(self) -> int:
        return self._n

    def first_keys(self) -> list[str]:
        return list(self._keys)

    def read(self, indices, on_error="raise"):
        e = self.error
        if on_error != "skip":
            raise e
        return [{"__error__": str(DataError(e.reason, path=e.path, shard=e.shard, sample=int(i)))} for i in indices]


def _open_reader(path, fmt, shard_id, columns, cache_dir):
    try:
        return READERS[fmt](path, shard=shard_id, columns=columns, cache_dir=cache_dir)
    except OSError as e:
        raise DataError(f"cannot read file: {e.strerror or e}", path=path, shard=shard_id) from e


def _default_name(source, paths: list[str]) -> str:
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
    common = os.path.commonpath([os.path.dirname(p) for p in paths])
    return os.path.basename(common) or "dataset"


def open_dataset(source, *, name: str | None = None, format: str | None = None,
                 columns: Sequence[str] | None = None, cache_dir: str | None = None,
                 on_error: str = "raise", split: str | None = None, allow_unsafe_types: bool = False,
                 validate_hash: str | None = None, split_part: str | None = None, **energon_options) -> Dataset:
    """Open JSONL and/or Parquet files as one Dataset, counting the samples of every file.

    source: a directory (all supported files in it, recursively, sorted by relative path; hidden
    files skipped), a glob pattern, a single file path, or a list of those (in list order).
    name: dataset name (default: the directory or file name). format: "jsonl" | "parquet" | None
    (by extension: .jsonl/.json/.ndjson[.gz|.zst], .parquet/.pq). columns: required columns; records
    are projected to them. A JSONL record missing one raises DataError at read time naming file,
    shard, sample and column; a Parquet file without one raises at open time. cache_dir: fallback
    location of JSONL index caches (see ``index_cache``). on_error: "raise" | "skip" (see ``Dataset.read``).

    Raises DataError: no files matched; unknown file type; truncated/corrupt .gz/.zst; unreadable
    Parquet; missing Parquet column; an empty file (with on_error="skip" an empty file becomes a
    shard of 0 samples and a DataWarning is issued instead). ValueError for bad arguments.

    MDS (format="mds", or auto-detected when ``source`` is a directory holding a streaming
    ``index.json``): one dataset directory per call; ``split``, ``allow_unsafe_types`` and
    ``validate_hash`` apply to it only (see ``mds.open_mds``).
    """
    from . import energon  # Energon-prepared WebDataset (format="energon" or a root with .nv-meta/): energon.open_energon
    if format == "energon" or (format is None and energon.is_energon_source(source)):
        return energon.open_energon(source, name=name, columns=columns, cache_dir=cache_dir, on_error=on_error,
                                    split_part=split_part or "train", allow_unsafe_types=allow_unsafe_types,
                                    **energon_options)
    if split_part is not None or energon_options:
        raise ValueError(f"split_part and {sorted(energon_options)} apply to Energon datasets only (format='energon')")
    from . import mds  # registration of the MDS reader (imported here: mds builds on this module)
    if format == "mds" or (format is None and mds.is_mds_source(source, split)):
        return mds.open_mds(source, name=name, columns=columns, cache_dir=cache_dir, on_error=on_error, split=split,
                            allow_unsafe_types=allow_unsafe_types, validate_hash=validate_hash)
    if split is not None or allow_unsafe_types or validate_hash is not None:
        raise ValueError("split, allow_unsafe_types and validate_hash apply to MDS datasets only (format='mds')")
    if format is not None and format not in FORMATS:
        raise ValueError(f"format must be one of {FORMATS} or None, not {format!r}")
    if on_error not in ("raise", "skip"):
        raise ValueError(f"on_error must be 'raise' or 'skip', not {on_error!r}")
    if isinstance(columns, str):
        columns = [columns]
    columns = tuple(columns) if columns is not None else None
    files = expand_source(source, format)

    def scan(item):
        shard_id, (path, fmt) = item
        st = os.stat(path)
        reader = _open_reader(path, fmt, shard_id, columns, cache_dir)
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
                          DataWarning, stacklevel=2)
        shards.append(info)
    ds = Dataset(name or _default_name(source, [p for p, _ in files]), shards,
                 columns=columns, on_error=on_error, cache_dir=cache_dir)
    for shard_id, (_, reader) in enumerate(results[:MAX_OPEN_READERS]):
        ds._remember(shard_id, reader)
    return ds


def inspect_source(source, **kw) -> dict:
    """Summary for ``zephon inspect PATH``.

    kw: as for ``open_dataset``. Returns ``{"name", "format" ("jsonl" | "parquet" | "mixed"),
    "num_shards", "num_samples", "columns", "shards": [{"path", "format", "num_samples",
    "size_bytes", "columns"}, ...]}``. A shard's columns: the requested ones if given, else its Parquet
    schema names or the keys of its first JSONL record; top-level ``columns``: those common to every
    non-empty shard. Raises like ``open_dataset``.
    """
    ds = open_dataset(source, **kw)
    formats = sorted({s.format for s in ds.shards})
    per_shard = [(list(ds.columns) if ds.columns is not None else ds._reader(i).first_keys()) if s.num_samples else []
                 for i, s in enumerate(ds.shards)]
    # columns present in every non-empty shard; each shard's own list is reported too, so a reader
    # sees at once when files disagree
    non_empty = [c for c in per_shard if c]
    columns = [c for c in non_empty[0] if all(c in other for other in non_empty)] if non_empty else []
    return {
        "name": ds.name,
        "format": formats[0] if len(formats) == 1 else "mixed",
        "num_shards": len(ds.shards),
        "num_samples": ds.num_samples,
        "columns": columns,
        "shards": [{"path": s.path, "format": s.format, "num_samples": s.num_samples, "size_bytes": s.size_bytes,
                    "columns": cols} for s, cols in zip(ds.shards, per_shard)],
    }
