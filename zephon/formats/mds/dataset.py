"""An MDS dataset directory opened as a ``Dataset``: one shard per ``index.json`` entry.

``open_mds`` (reached through ``open_dataset(path, format="mds")``, or automatically when the directory
holds a streaming ``index.json``) parses the index and stats every shard file; it reads no shard data.
A shard is opened (``MdsReader``) on its first read. Bad input raises ``DataError`` naming the file,
shard and sample; with ``on_error="skip"`` a bad sample reads as ``{"__error__": message}`` and a shard
that cannot be opened at all gives that for each of its samples (counted and reported by the loader).
"""
from __future__ import annotations

import os
from typing import Sequence

from ..base import Dataset, ShardInfo
from ..errors import DataError
from .index import FORMAT, ShardMeta, data_file, find_index, parse_index
from ..remote import is_remote, local_path
from .integrity import hasher
from .reader import MdsReader
from ..remote.readahead import DEFAULT_CHUNKS
from .remote import RemoteShards, open_remote_index, remote_shard_info


class MdsDataset(Dataset):
    """A ``Dataset`` over the shards of one MDS ``index.json`` (one ``ShardInfo`` per shard).

    ``shards[i].path`` is the file read (raw shard, or the compressed one), ``num_samples`` the
    index's ``samples``, ``size_bytes`` / ``mtime_ns`` that file's size and time when opened. Picklable
    (index entries and options only). ``fingerprint()`` comes from the index content, so it does not
    change when a compressed shard gets decompressed or the data is copied elsewhere (or read from a bucket).
    remote: for a dataset at a URL, its ``mds.remote.RemoteShards`` (then ``shards[i].path`` is the object URL
    and shards are read from the local cache); None for a local directory.
    """

    def __init__(self, name: str, shards: Sequence[ShardInfo], metas: Sequence[ShardMeta], *,
                 columns: Sequence[str] | None = None, on_error: str = "raise", cache_dir: str | None = None,
                 split: str | None = None, validate_hash: str | None = None, remote: RemoteShards | None = None):
        super().__init__(name, shards, columns=columns, on_error=on_error, cache_dir=cache_dir)
        self.remote = remote
        if len(metas) != len(self.shards):
            raise ValueError(f"{len(metas)} index entries for {len(self.shards)} shards")
        self.metas: tuple[ShardMeta, ...] = tuple(metas)
        self.split = split
        self.validate_hash = validate_hash

    def __repr__(self):
        return (f"MdsDataset(name={self.name!r}, shards={len(self.shards)}, num_samples={self.num_samples}, "
                f"columns={self.columns!r}, split={self.split!r}, on_error={self.on_error!r})")

    def prefetch(self, shard_ids) -> None:
        """Remote: fetch these shards into the cache in the background (``RemoteShards.prefetch``)."""
        if self.remote is not None:
            self.remote.prefetch(self.metas, shard_ids)

    def _check_unchanged(self, shard_id: int, info: ShardInfo) -> None:
        if self.remote is None:  # a remote shard's cached copy is checked by size (and hash) when fetched
            super()._check_unchanged(shard_id, info)

    def sample_sizes(self, shard_id: int):
        """None for every MDS shard: a finite pass over MDS keeps the count split. Only a local raw shard's header
        knows its samples' bytes (a remote or compressed one would have to be fetched or decompressed first), and a
        split that depends on where the data lives gives a bucket and its local copy different global batches.

        shard_id: the shard (unused)."""
        return None

    def _make_reader(self, shard_id: int):
        info, meta = self.shards[shard_id], self.metas[shard_id]

        def open_reader():
            try:
                if self.remote is not None:  # validate_hash is checked on download, before the copy is visible
                    self.remote.start_predownload(self.metas, getattr(self, "predownload", None))
                    return MdsReader(meta, info.path, shard=shard_id, columns=self.columns,
                                     file=self.remote.file(meta, shard_id))
                return MdsReader(meta, info.path, shard=shard_id, columns=self.columns, cache_dir=self.cache_dir,
                                 validate_hash=self.validate_hash)
            except OSError as e:
                raise DataError(f"cannot read file: {e.strerror or e}", path=info.path, shard=shard_id) from e

        return self._open_or_broken(shard_id, open_reader,
                                    self.columns if self.columns is not None else meta.column_names)

    def fingerprint(self) -> dict:
        """``{"name", "columns", "format": "mds", "shards": [[raw basename, samples, raw bytes,
        {algorithm: hexdigest}], ...]}`` from index.json (no paths, mtimes or compressed sizes)."""
        return {
            "name": self.name,
            "columns": list(self.columns) if self.columns is not None else None,
            "format": FORMAT,
            "shards": [[m.raw.basename, m.samples, m.raw.bytes, dict(sorted(m.raw.hashes.items()))]
                       for m in self.metas],
        }


def open_mds(source, *, name: str | None = None, columns: Sequence[str] | None = None,
             cache_dir: str | None = None, on_error: str = "raise", split: str | None = None,
             allow_unsafe_types: bool = False, validate_hash: str | None = None, local: str | None = None,
             download_retry: int = 2, download_timeout: float = 60.0, keep_zip: bool = False, cache_limit=None,
             predownload: int | None = None, read_ahead: int = 4,
             read_ahead_chunks: int = DEFAULT_CHUNKS) -> MdsDataset:
    """Open an MDS dataset written by ``streaming.MDSWriter`` (layout: ``index`` and ``reader`` modules).

    source: the dataset directory (holding ``index.json``), a root with split directories (then pass
        ``split``: ``<source>/<split>/index.json``), or the path of an ``index.json``. One dataset per call.
    name: dataset name; default the directory name (``root/split`` with a split).
    columns: return only these columns (all shards must have them); None = all.
    cache_dir: where compressed shards are decompressed (``<cache_dir>/mds/``; default
        ``$ZEPHON_CACHE_DIR`` or ``~/.cache/zephon``).
    on_error: "raise" | "skip" (see ``Dataset.read``).
    split: the split directory under a root, or None.
    allow_unsafe_types: allow ``pkl`` columns (unpickling runs arbitrary code; not needed when
        ``columns`` leaves them out).
    validate_hash: a hash algorithm the index recorded (e.g. "sha1", "xxh64"); each shard file is
        checked once per process, on first read (at a URL: each download, before it enters the cache).
    local, download_retry, download_timeout, keep_zip, cache_limit, predownload: for a ``source`` at an
        object-storage URL (``s3://``, ``msc://``, ``gs://``), mosaicml-streaming's meanings (``mds.remote``,
        docs/remote.md): the cache directory (default ``<cache_dir>/remote/<hash of the URL>``), re-attempts
        and seconds per attempt of each request, keep the compressed copies, bytes (or ``"10gb"``) the cache
        may hold (least recently used shards not being read are evicted), and samples' worth of shards a
        background thread downloads ahead in index order (None or 0: only on demand). Local sources ignore them.
    read_ahead: at a URL, downloads at once of the shards the core will read next (``Dataset.prefetch``, in
        the core's order; ``remote.readahead``); 0 turns read-ahead off. read_ahead_chunks: how many chunks
        past its current one each lane hints (the horizon; default 16).

    Raises DataError (always, whatever on_error): no index.json (naming the splits when the root has
    some), a bad index.json, an unknown encoding or compression, a refused ``pkl`` column, a requested
    column or the validate_hash algorithm missing from a shard's entry, a shard file missing.
    ValueError for bad arguments (unknown hash algorithm, a list of sources).
    """
    _check_arguments(on_error, split, validate_hash)
    if isinstance(columns, str):
        columns = [columns]
    columns = tuple(columns) if columns is not None else None
    source = local_path(source)
    if is_remote(source):
        root, metas = open_remote_index(os.fspath(source), split, local=local, cache_dir=cache_dir,
                                        download_retry=download_retry, download_timeout=download_timeout,
                                        cache_limit=cache_limit, allow_unsafe_types=allow_unsafe_types,
                                        columns=columns)
        if not metas:
            raise DataError("index.json lists no shards", path=root.url_of("index.json"))
        shards = [remote_shard_info(root, i, m, validate_hash) for i, m in enumerate(metas)]
        if name is None:
            name = os.path.basename(os.fspath(source).rstrip("/")) + (f"/{split}" if split is not None else "")
        ds = MdsDataset(name, shards, metas, columns=columns, on_error=on_error, cache_dir=cache_dir, split=split,
                        validate_hash=validate_hash, remote=RemoteShards(root, keep_zip, validate_hash, read_ahead,
                                                            read_ahead_chunks))
        ds.predownload = predownload
        return ds
    index_path = find_index(source, split)
    metas = parse_index(index_path, allow_unsafe_types, columns)
    if not metas:
        raise DataError("index.json lists no shards", path=index_path)
    shards = [_shard_info(i, m, columns, validate_hash) for i, m in enumerate(metas)]
    if name is None:
        root = os.path.abspath(os.fspath(source))
        if os.path.isfile(root):
            root = os.path.dirname(root)
        name = os.path.basename(root) + (f"/{split}" if split is not None else "")
    return MdsDataset(name, shards, metas, columns=columns, on_error=on_error, cache_dir=cache_dir,
                      split=split, validate_hash=validate_hash)


def _check_arguments(on_error: str, split, validate_hash) -> None:
    if on_error not in ("raise", "skip"):
        raise ValueError(f"on_error must be 'raise' or 'skip', not {on_error!r}")
    if split is not None and (not isinstance(split, str) or not split):
        raise ValueError(f"split must be a non-empty string or None, not {split!r}")
    if validate_hash is not None:
        if not isinstance(validate_hash, str):
            raise ValueError(f"validate_hash must be a hash algorithm name or None, not {validate_hash!r}")
        hasher(validate_hash)  # ValueError for an unknown name, ImportError without xxhash


def _shard_info(i: int, m: ShardMeta, columns: tuple | None, validate_hash: str | None) -> ShardInfo:
    """ShardInfo of index entry ``i`` (its data file stat'ed); DataError when it cannot be read as asked."""
    if columns is not None:
        missing = [c for c in columns if c not in m.column_names]
        if missing:
            raise DataError(f"missing column {missing[0]!r} (shard has: {', '.join(map(repr, m.column_names))})",
                            path=m.index_path, shard=i)
    path = data_file(m)
    if path is None:
        listed = m.raw.basename if m.zip is None else f"{m.zip.basename} (or {m.raw.basename})"
        raise DataError(f"shard file missing: index.json lists {listed}", path=m.zip_path or m.raw_path, shard=i)
    if validate_hash is not None:
        entry = m.zip if (m.zip is not None and path == m.zip_path) else m.raw
        if validate_hash not in entry.hashes:
            recorded = (f"only {sorted(entry.hashes)}" if entry.hashes
                        else "no hashes (MDSWriter(hashes=[...]) was not set)")
            raise DataError(f"validate_hash={validate_hash!r}, but the index recorded {recorded} for "
                            f"{entry.basename}", path=m.index_path, shard=i)
    st = os.stat(path)
    return ShardInfo(path, m.samples, FORMAT, st.st_size, st.st_mtime_ns)
