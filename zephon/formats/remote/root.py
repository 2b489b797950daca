"""``RemoteRoot``: a remote source (a URL prefix or one object) with its local cache and fetch options.

What the format readers use: ``url_of(rel)`` names objects; ``metadata(rel)`` fetches a small file (index.json,
``.nv-meta/*``, ``.tar.idx``) into the cache; ``ensure(rel, size)`` makes a shard's cached copy present once
across threads and processes (hash-checked before it becomes visible); ``cached(rel, size)`` and
``ranges(rel, size)`` give readers a ``pread`` surface over a cached copy or over ranged GETs. Picklable:
options and paths only; clients and locks are per process. See docs/remote.md.
"""
from __future__ import annotations

import os
import time
from typing import Callable

from ..errors import DataError
from .cache import LocalCache, pinned
from .fetch import MAX_BACKOFF, Fetcher, count
from .files import CachedFile, RangeFile, RangePread
from .manifest import ObjectChanged, identity, matches
from .urls import cache_key, join, parse_size, relative

_WRITE_BLOCK = 1 << 20
_VERIFIED: dict = {}   # (pid, path) -> the copy (inode, mtime) and identity checked in this process


def _digest(fd: int, h) -> str:
    """Hex digest of the file open at ``fd`` by hash object ``h``."""
    at = 0
    while True:
        block = os.pread(fd, _WRITE_BLOCK, at)
        if not block:
            return h.hexdigest()
        h.update(block)
        at += len(block)


def unchanged(want: dict, etag: str) -> None:
    """Raise ObjectChanged when ``etag`` (of what a GET returned) is not the ETag ``want`` expects."""
    if want["etag"] and etag and etag != want["etag"]:
        raise ObjectChanged(want["url"], want["etag"], etag)


def default_local(url: str, cache_dir: str | None) -> str:
    """The default cache directory of remote source ``url``: ``<cache_dir>/remote/<hash of url>``
    (``cache_dir`` None: ``$ZEPHON_CACHE_DIR`` or ``~/.cache/zephon``)."""
    from ..index_cache import default_cache_dir
    return os.path.join(cache_dir or default_cache_dir(), "remote", cache_key(url))


class RemoteRoot:
    """A remote prefix (or object) ``url`` read through the local directory ``local``.

    url: ``s3://bucket/prefix`` etc. local: cache directory (None: ``default_local``). download_retry /
    download_timeout: see ``fetch.Fetcher``. cache_limit: bytes (or ``"10gb"``) the cache may hold, None = no
    limit. cache_dir: where the default ``local`` goes.
    """

    def __init__(self, url: str, *, local: str | None = None, download_retry: int = 2,
                 download_timeout: float = 60.0, cache_limit=None, cache_dir: str | None = None):
        self.url = url.rstrip("/")
        self.fetcher = Fetcher(download_retry, download_timeout)
        # a waiter gives another process's download of the same file all of its attempts, and then some
        wait = (download_retry + 1) * (float(download_timeout) + MAX_BACKOFF) + 30.0
        self.cache = LocalCache(os.fspath(local) if local is not None else default_local(self.url, cache_dir),
                                parse_size(cache_limit), wait)
        self.cache.bind(self.url)
        self.known: dict = {}   # path below the root -> ObjectInfo from the last listing

    def __repr__(self):
        return f"RemoteRoot({self.url!r}, local={self.cache.root!r}, limit={self.cache.limit})"

    @property
    def local(self) -> str:
        """The cache directory."""
        return self.cache.root

    def url_of(self, rel: str) -> str:
        """URL of the object at ``rel`` below the root."""
        return join(self.url, rel)

    def metadata(self, rel: str, *, refresh: bool = True) -> str:
        """Fetch small object ``rel`` (whole, in memory) into the cache and return its local path.

        refresh: fetch even when a copy is there (index files may change between runs); False reuses a copy
        whose manifest entry matches the listing (``known``), or any the cache owns when nothing was listed.
        Raises ObjectMissing / AccessDenied / RemoteError naming the URL.
        """
        path, url = self.cache.path(rel), self.url_of(rel)
        if not refresh:
            info = self.known.get(rel)
            if info is not None and self.fresh(rel, self.identity(rel, info.size)):
                count(cache_hits=1)
                return path
            entry = self.cache.entry(rel)
            if info is None and entry is not None and entry.get("url") == url and os.path.isfile(path):
                count(cache_hits=1)
                return path
            count(cache_misses=1)
        data, etag = self.fetcher.read_object(url)
        with self.cache.lock(rel, url):
            with self.cache.writing([(rel, len(data))], url) as (f,):
                f.write(data)
            self.cache.record(rel, identity(url, len(data), etag))
        return path

    def identity(self, rel: str, size: int, etag: str | None = None, hashes: dict | None = None,
                 url: str | None = None) -> dict:
        """The manifest entry object ``rel`` must have now: ``url`` (default ``url_of(rel)``), ``size``, the
        ``etag`` given or the listing's (``known``), the index's ``hashes`` (algorithm -> hex)."""
        if etag is None:
            info = self.known.get(rel)
            etag = info.etag if info is not None else ""
        return identity(url or self.url_of(rel), size, etag, hashes)

    def fresh(self, rel: str, want: dict, check: tuple | None = None) -> bool:
        """Whether the cached copy of ``rel`` is the object ``want`` (an ``identity``): present with its size,
        and its manifest entry matches. check: ``(hash factory, expected hex digest)`` to verify the copy's bytes
        too, once per process and copy (``validate_hash``); a copy that fails is not fresh (fetched again)."""
        path = self.cache.path(rel)
        try:
            st = os.stat(path)
        except OSError:
            return False
        if st.st_size != want["size"]:
            return False
        key = (os.getpid(), path)
        stamp = (st.st_ino, st.st_mtime_ns, want["url"], want["etag"], tuple(sorted(want["hashes"].items())))
        if _VERIFIED.get(key) == stamp:
            return True
        if not matches(self.cache.entry(rel), want):
            return False
        if check is not None:
            with pinned(path) as fd:
                if fd is None or _digest(fd, check[0]()) != check[1].lower():
                    return False
        _VERIFIED[key] = stamp
        return True

    def ensure(self, rel: str, size: int, *, hasher: Callable | None = None, expected: str | None = None,
               shard: int | None = None, mtime_ns: int | None = None, etag: str | None = None,
               hashes: dict | None = None) -> str:
        """The local path of a complete copy of object ``rel`` (``size`` bytes), downloading it when missing
        or when the cached copy is not the object the dataset was opened with (``fresh``).

        One download at a time per file across threads and processes; the copy becomes visible only whole.
        hasher / expected: a hash object factory and the hex digest the copy must have (checked while
        writing, and on a cached copy once per process; a downloaded mismatch raises DataError naming the URL
        and ``shard``, and nothing is kept). etag: the ETag the object must have (default: the listing's);
        hashes: the index's digests of the object (algorithm -> hex), for its identity.
        mtime_ns: the modification time the copy gets (stable for the object's version, so indexes keyed on it,
        such as JSONL line indexes, stay valid when an evicted copy is fetched again).
        Raises ObjectChanged when the object's ETag is no longer the one expected (rewritten during the pass).
        """
        want = self.identity(rel, size, etag, hashes)
        check = (hasher, expected) if hasher is not None and expected is not None else None
        path = self.cache.path(rel)
        if self.fresh(rel, want, check):
            count(cache_hits=1)
            return path
        with self.cache.lock(rel, want["url"]):
            if self.fresh(rel, want, check):  # another thread or process fetched it meanwhile
                count(cache_hits=1)
            else:
                count(cache_misses=1)
                self.cache.disown(rel)
                with self.cache.writing([(rel, size)], want["url"]) as (f,):
                    w = _Hashing(f, hasher() if hasher is not None else None)
                    got = self.fetcher.download(want["url"], w, size)
                    unchanged(want, got.etag)
                    check_digest(w.h, expected, want["url"], shard, "the downloaded shard")
                    # owned before it appears: a copy renamed into place but not yet in the manifest would
                    # count against cache_limit nowhere (neither a temporary copy nor an owned file)
                    self.cache.record(rel, dict(want, etag=got.etag or want["etag"]))
                if mtime_ns is not None:
                    os.utime(path, ns=(time.time_ns(), mtime_ns))
        return path

    def cached(self, rel: str, size: int, **check) -> CachedFile:
        """A ``pread`` view of the cached copy of ``rel`` (fetched on first use and again after eviction)."""
        return CachedFile(lambda: self.ensure(rel, size, **check), size, self.url_of(rel))

    def ranges(self, rel: str, size: int) -> RangePread:
        """A ``pread`` view of object ``rel`` through ranged GETs (nothing cached)."""
        return RangePread(self.fetcher, self.url_of(rel), size)

    def range_file(self, url: str, size: int) -> RangeFile:
        """A seekable binary file over object ``url`` through ranged GETs."""
        return RangeFile(self.fetcher, url, size)

    def list(self, rel: str = ""):
        """Objects below ``rel`` (all depths), sorted by URL (``backends.ObjectInfo``); each becomes ``known``
        (the ETag and size its cached copy must match)."""
        found = self.fetcher.list(self.url_of(rel))
        for o in found:
            self.known[relative(o.url, self.url)] = o
        return found


class _Hashing:
    """A write-through file wrapper feeding a hash object (None: plain); seek rewinds both (a retry)."""

    def __init__(self, f, h):
        self.f, self.h, self.h0 = f, h, (h.copy() if h is not None else None)

    def write(self, data) -> int:
        if self.h is not None:
            self.h.update(data)
        return self.f.write(data)

    def seek(self, pos: int, whence: int = 0) -> int:
        if pos == 0 and whence == 0 and self.h0 is not None:
            self.h = self.h0.copy()
        return self.f.seek(pos, whence)


def check_digest(h, expected: str | None, url: str, shard: int | None, what: str) -> None:
    """Raise DataError naming ``url`` and ``shard`` when hash object ``h`` does not give ``expected``."""
    if h is None or expected is None:
        return
    got = h.hexdigest()
    if got != expected.lower():
        raise DataError(f"{h.name} checksum mismatch for {what} (index.json says {expected}, the object has {got}): "
                        f"the object is corrupted; nothing was cached", path=url, shard=shard)


def hashing_writer(f, h) -> _Hashing:
    """``f`` wrapped so that every write also feeds hash object ``h`` (None: plain); its ``h`` attribute is
    the hash of what was written since the last rewind (a retried download starts over)."""
    return _Hashing(f, h)
