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
from .cache import LocalCache
from .fetch import MAX_BACKOFF, Fetcher
from .files import CachedFile, RangeFile, RangePread
from .urls import cache_key, join, parse_size

_WRITE_BLOCK = 1 << 20


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

        refresh: fetch even when a copy is there (index files may change between runs); False reuses it.
        Raises ObjectMissing / AccessDenied / RemoteError naming the URL.
        """
        path = self.cache.path(rel)
        if not refresh and os.path.isfile(path):
            return path
        url = self.url_of(rel)
        data = self.fetcher.read_all(url)
        with self.cache.lock(rel, url):
            with self.cache.writing([(rel, len(data))], url) as (f,):
                f.write(data)
        return path

    def ensure(self, rel: str, size: int, *, hasher: Callable | None = None, expected: str | None = None,
               shard: int | None = None, mtime_ns: int | None = None) -> str:
        """The local path of a complete copy of object ``rel`` (``size`` bytes), downloading it when missing.

        One download at a time per file across threads and processes; the copy becomes visible only whole.
        hasher / expected: a hash object factory and the hex digest the copy must have (checked while
        writing; a mismatch raises DataError naming the URL and ``shard``, and nothing is kept).
        mtime_ns: the modification time the copy gets (stable for the object's version, so indexes keyed on it,
        such as JSONL line indexes, stay valid when an evicted copy is fetched again).
        """
        if self.cache.ready(rel, size):
            return self.cache.path(rel)
        url = self.url_of(rel)
        with self.cache.lock(rel, url):
            if not self.cache.ready(rel, size):
                with self.cache.writing([(rel, size)], url) as (f,):
                    w = _Hashing(f, hasher() if hasher is not None else None)
                    self.fetcher.download(url, w, size)
                    check_digest(w.h, expected, url, shard, "the downloaded shard")
                if mtime_ns is not None:
                    os.utime(self.cache.path(rel), ns=(time.time_ns(), mtime_ns))
        return self.cache.path(rel)

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
        """Objects below ``rel`` (all depths), sorted by URL (``backends.ObjectInfo``)."""
        return self.fetcher.list(self.url_of(rel))


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
