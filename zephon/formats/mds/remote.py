"""MDS datasets at an object-storage URL, with mosaicml-streaming's ``remote`` / ``local`` semantics.

``index.json`` is fetched into ``local`` (``<local>/index.json``, as streaming lays it out; ``split`` adds a
directory on both sides); each shard is downloaded into ``local`` on its first read, by one thread of one
process at a time. A compressed shard (``zip_data``) is downloaded and decompressed into its raw file there;
the compressed copy is kept only with ``keep_zip``. ``validate_hash`` checks what was downloaded (and the
decompressed bytes) before it becomes visible, so a corrupted object never enters the cache, and a cached
copy once per process before its first use. A cached shard is used only when the cache's manifest says it
is the object listed (ETag) and indexed (size, hashes) now (``remote.manifest``); anything else is fetched
again. Readers read the cached copy while pinned (``remote.cache``), so ``cache_limit`` eviction never
removes a shard being read. Shards the core will read next are fetched ahead (``prefetch``, ``read_ahead``).
"""
from __future__ import annotations

import os
import threading

from ..base import ShardInfo
from ..codecs import iter_blocks, mds_codec
from ..errors import DataError
from ..remote import AccessDenied, ObjectMissing, RemoteRoot, check_digest, hashing_writer, join
from ..remote.readahead import DEFAULT_CHUNKS, ReadAhead, has_room
from ..remote.root import unchanged
from .index import FORMAT, INDEX_BASENAME, ShardMeta, parse_index
from .integrity import hasher


class RemoteShards:
    """How an ``MdsDataset`` at a URL gets its shards: the ``RemoteRoot`` of its split, ``keep_zip`` and
    ``validate_hash``; ``read_ahead`` / ``read_ahead_chunks``: the ``ReadAhead`` settings. Picklable."""

    def __init__(self, root: RemoteRoot, keep_zip: bool, validate_hash: str | None, read_ahead: int = 4,
                 read_ahead_chunks: int = DEFAULT_CHUNKS):
        self.root, self.keep_zip, self.validate_hash = root, bool(keep_zip), validate_hash
        self.ahead = ReadAhead(read_ahead, read_ahead_chunks)

    def prefetch(self, metas, shards) -> None:
        """Fetch shards ``shards`` (indexes into ``metas``, in the order they will be read) in the background
        (``remote.readahead``), skipping cached ones and any that would need an eviction."""
        for s in shards:
            self.ahead.submit(s, lambda m=metas[s], s=s: self._ahead_one(m, s))

    def _ahead_one(self, meta: ShardMeta, shard: int) -> None:
        if self.root.fresh(meta.raw.basename, self._want(meta)):
            return
        if has_room(self.root.cache, meta.raw.bytes + (meta.zip.bytes if meta.zip is not None else 0)):
            self.ensure(meta, shard)

    def start_predownload(self, metas, samples: int) -> None:
        """Once per process: a daemon thread downloads shards in index order until they hold ``samples``
        samples, skipping cached ones and stopping where the next would need an eviction under
        ``cache_limit`` (it never evicts). Reads run meanwhile; a shard both want is fetched once."""
        if getattr(self, "_predownload_pid", None) == os.getpid() or not samples or samples <= 0:
            return
        self._predownload_pid = os.getpid()
        threading.Thread(target=self._predownload, args=(list(metas), int(samples)), daemon=True,
                         name="zephon-predownload").start()

    def _predownload(self, metas, samples: int) -> None:
        cache, done = self.root.cache, 0
        for shard, meta in enumerate(metas):
            if done >= samples:
                return
            done += meta.samples
            if self.root.fresh(meta.raw.basename, self._want(meta)):
                continue
            if not has_room(cache, meta.raw.bytes + (meta.zip.bytes if meta.zip is not None else 0)):
                return
            try:
                self.ensure(meta, shard)
            except Exception:  # the read that needs this shard reports the error itself
                return

    def file(self, meta: ShardMeta, shard: int):
        """A ``pread`` view of the shard's raw bytes in the cache (downloaded on first use, again if evicted)."""
        url = self.root.url_of(meta.raw.basename)
        from ..remote import CachedFile
        return CachedFile(lambda: self.ensure(meta, shard), meta.raw.bytes, url)

    def _check(self, entry):
        algo = self.validate_hash
        if algo and algo in entry.hashes:
            return (lambda: hasher(algo)), entry.hashes[algo]
        return None, None

    def _want(self, meta: ShardMeta) -> dict:
        """The identity the cached raw shard must have: the object it comes from (the compressed one for a
        ``zip_data`` shard), its ETag in the listing, the raw size and the index's raw digests."""
        src = meta.zip if meta.zip is not None else meta.raw
        info = self.root.known.get(src.basename)
        return self.root.identity(meta.raw.basename, meta.raw.bytes, info.etag if info is not None else "",
                                  meta.raw.hashes, url=self.root.url_of(src.basename))

    def ensure(self, meta: ShardMeta, shard: int) -> str:
        """Local path of the shard's raw file, downloading (and decompressing) it when missing or not the
        object indexed now (``RemoteRoot.fresh``; with ``validate_hash`` a cached copy is hashed once per
        process). Raises ObjectChanged when the object's ETag changed since the dataset was opened."""
        root, raw = self.root, meta.raw.basename
        make, expected = self._check(meta.raw)
        if meta.zip is None:
            return root.ensure(raw, meta.raw.bytes, hasher=make, expected=expected, shard=shard,
                               hashes=meta.raw.hashes)
        cache, want = root.cache, self._want(meta)
        check = (make, expected) if make is not None else None
        if root.fresh(raw, want, check):
            return cache.path(raw)
        zip_url = want["url"]
        with cache.lock(raw, zip_url):
            if root.fresh(raw, want, check):
                return cache.path(raw)
            cache.disown(raw)
            with cache.writing([(raw, meta.raw.bytes), (None, meta.zip.bytes)], zip_url) as (rf, zf):
                zmake, zexpected = self._check(meta.zip)
                w = hashing_writer(zf, zmake() if zmake else None)
                got = root.fetcher.download(zip_url, w, meta.zip.bytes)
                unchanged(want, got.etag)
                zf.flush()
                check_digest(w.h, zexpected, zip_url, shard, "the downloaded compressed shard")
                self._decompress(meta, zf.name, rf, zip_url, shard)
                # owned before they appear (``RemoteRoot.ensure``): counted against cache_limit all along
                etag = got.etag or want["etag"]
                cache.forget_all({raw: dict(want, etag=etag), **({meta.zip.basename: root.identity(
                    meta.zip.basename, meta.zip.bytes, etag, meta.zip.hashes)} if self.keep_zip else {})})
                if self.keep_zip:  # the complete compressed copy, renamed into place whole
                    os.replace(zf.name, cache.path(meta.zip.basename))
        return cache.path(raw)

    def _decompress(self, meta: ShardMeta, src: str, out, zip_url: str, shard: int) -> None:
        codec, _ = mds_codec(meta.compression)
        make, expected = self._check(meta.raw)
        h = make() if make else None
        w = hashing_writer(out, h)
        size = 0
        try:
            for block in iter_blocks(src, codec=codec.name):
                size += len(block)
                if size > meta.raw.bytes:
                    raise DataError(f"decompresses to more than raw_data.bytes={meta.raw.bytes} bytes",
                                    path=zip_url, shard=shard)
                w.write(block)
        except DataError as e:
            raise DataError(e.reason, path=zip_url, shard=shard) from None
        if size != meta.raw.bytes:
            raise DataError(f"decompresses to {size} bytes, index.json says raw_data.bytes={meta.raw.bytes}",
                            path=zip_url, shard=shard)
        check_digest(h, expected, zip_url, shard, "the decompressed shard")


def open_remote_index(url: str, split: str | None, *, local: str | None, cache_dir: str | None, download_retry,
                      download_timeout, cache_limit, allow_unsafe_types: bool, columns) -> tuple[RemoteRoot, list]:
    """``(RemoteRoot of the split, parsed index entries)`` of the MDS dataset at ``url``.

    url: the dataset URL (or its index.json). split: a split directory below it, or None. local: the cache
    directory (``<local>/<split>`` holds the split, as in streaming). Raises DataError when there is no
    index.json there, RemoteError naming the URL when it cannot be fetched.
    """
    if url.rstrip("/").endswith("/" + INDEX_BASENAME):
        url = url.rstrip("/")[: -len(INDEX_BASENAME) - 1]
    base = join(url, split) if split else url
    if local is not None and split:
        local = os.path.join(os.fspath(local), split)
    root = RemoteRoot(base, local=local, download_retry=download_retry, download_timeout=download_timeout,
                      cache_limit=cache_limit, cache_dir=cache_dir)
    try:
        index_path = root.metadata(INDEX_BASENAME)
    except ObjectMissing:
        raise DataError(f"no {INDEX_BASENAME} at this URL (not an MDS dataset{', or no such split' if split else ''})",
                        path=root.url_of(INDEX_BASENAME)) from None
    try:  # the shards' ETags: a cached copy is used only when it is the object listed now
        root.list()
    except AccessDenied:  # no list permission: copies are then identified by size and the index's hashes
        pass
    return root, parse_index(index_path, allow_unsafe_types, columns)


def remote_shard_info(root: RemoteRoot, i: int, m: ShardMeta, validate_hash: str | None) -> ShardInfo:
    """ShardInfo of index entry ``i``: the object URL and its indexed size (no request made)."""
    entry = m.zip if m.zip is not None else m.raw
    if validate_hash is not None and validate_hash not in entry.hashes and validate_hash not in m.raw.hashes:
        recorded = f"only {sorted(entry.hashes)}" if entry.hashes else "no hashes (MDSWriter(hashes=[...]) was not set)"
        raise DataError(f"validate_hash={validate_hash!r}, but the index recorded {recorded} for {entry.basename}",
                        path=root.url_of(INDEX_BASENAME), shard=i)
    return ShardInfo(root.url_of(entry.basename), m.samples, FORMAT, entry.bytes, 0)
