"""Datasets: ordered lists of shards with sample counts, and random access by ``(shard_id, sample indices)``.

The format-independent part: ``ShardInfo``, ``Dataset`` (reader cache, change detection, fingerprint) and
``BrokenShard``. Each format subclasses ``Dataset`` to say how a shard's reader is built
(``files.FileDataset`` for JSONL/Parquet, ``mds.MdsDataset``, ``energon.PreparedWebdataset``); this module
imports none of them (``registry`` maps format names to their openers).
"""
from __future__ import annotations

import os
import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import Sequence

from .errors import DataError

MAX_OPEN_READERS = 64   # per Dataset: bounds open file descriptors and index arrays held in memory


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


LOCAL_HINT_CHUNKS = 2  # nothing to fetch for a local file: a short horizon keeps hints cheap


class Dataset:
    """A list of shards with sample counts, read by ``(shard_id, sample indices)``.

    Picklable: it holds names, paths and options only; readers are opened lazily (at most
    ``MAX_OPEN_READERS`` at a time) and reopened after unpickling, e.g. in a spawned worker process.
    Thread-safe: readers may be shared by threads.
    Built by ``open_dataset`` (a format's subclass); the constructor does no I/O and trusts the given ShardInfo.
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

    def sample_sizes(self, shard_id: int):
        """Bytes of each sample of shard ``shard_id`` (int64 array, length its ``num_samples``) as the format
        knows them before reading a sample (JSONL line offsets), or None when it does not. A finite pass uses
        them to split its last rounds over the lanes by size (``work.balance``).

        shard_id: the shard. Raises DataError when the shard cannot be opened."""
        reader = self._reader(shard_id)
        sizes = getattr(reader, "sample_sizes", None)
        return None if sizes is None else sizes()

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

    def locate(self, shard_id: int, sample: int) -> dict:
        """Where sample ``sample`` of shard ``shard_id`` sits in its file, as far as its format knows (the reader's
        ``locate``): ``line`` (1-based) and ``bytes`` (``[start, stop)`` of the line in the decompressed stream)
        for JSON Lines; ``{}`` for a format that keeps no such index."""
        locate = getattr(self._reader(shard_id), "locate", None)
        return locate(sample) if locate is not None else {}

    def prefetch(self, shard_ids: Sequence[int]) -> None:
        """A hint: shards ``shard_ids`` (in the order the core will read them) are read soon. Remote
        datasets fetch them into their cache in the background; others ignore it. Never raises."""

    @property
    def read_ahead_chunks(self) -> int:
        """How many chunks past its current one each lane hints to ``prefetch`` (the read-ahead horizon): a
        remote dataset's ``read_ahead_chunks`` setting (``remote.readahead``), else ``LOCAL_HINT_CHUNKS``."""
        ahead = getattr(getattr(self, "remote", None), "ahead", None)
        return ahead.chunks if ahead is not None else LOCAL_HINT_CHUNKS

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
        """A new reader of shard ``shard_id``: an object with ``num_samples``, ``read(indices, on_error)``
        and ``first_keys()``. Each format's subclass says how; raises DataError when the file cannot be
        read or changed since the dataset was opened."""
        raise NotImplementedError(f"{type(self).__name__} does not say how its shards are read")

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
