"""Readers' views of remote objects, with the ``pread(n, at)`` / ``size()`` / ``close()`` surface of
``fileio.PreadFile``: ``CachedFile`` reads a cached copy (fetched again if evicted), ``RangePread`` reads byte
ranges of the object itself, and ``RangeFile`` is a seekable binary file over range reads (for pyarrow's
Parquet reader: footer first, then only the row groups asked for).
"""
from __future__ import annotations

import contextlib
import io
import os
import threading
from collections import OrderedDict
from typing import Callable, Iterator

from .cache import pinned

_MAX_REFETCH = 8     # a copy evicted this many times between fetch and read means the cache is far too small


class CachedFile:
    """A cached copy of one object, read by position while pinned (so eviction never removes it mid-read).

    ensure: ``ensure() -> local path``: makes the copy present (downloading it when missing) and returns it.
    size: the object's size in bytes. url: named in errors. Nothing is held open between reads, so an idle
    reader never keeps an evicted file's disk space.
    """

    def __init__(self, ensure: Callable[[], str], size: int, url: str):
        self.ensure, self._size, self.url = ensure, size, url

    def size(self) -> int:
        return self._size

    def __call__(self, n: int, at: int) -> bytes:
        """Up to ``n`` bytes at offset ``at``."""
        return self.preads([(at, at + n)])[0]

    def preads(self, spans) -> list[bytes]:
        """The bytes of each ``(start, end)`` span, read under one pin (``fileio.pread_spans``): a reader that
        wants many samples of the shard checks and pins the copy once, not once per sample."""
        with self._pinned() as (_, fd):
            return [os.pread(fd, b - a, a) for a, b in spans]

    @contextlib.contextmanager
    def local(self) -> Iterator[str]:
        """The cached copy's path, present and pinned (not evicted) while the block runs."""
        with self._pinned() as (path, _):
            yield path

    @contextlib.contextmanager
    def _pinned(self) -> Iterator[tuple[str, int]]:
        """``(path, descriptor)`` of the copy, present and pinned while the block runs (fetched again when it
        was evicted before it could be pinned). Raises RemoteError after ``_MAX_REFETCH`` evictions in a row."""
        for _ in range(_MAX_REFETCH):
            path = self.ensure()
            with pinned(path) as fd:
                if fd is not None:
                    yield path, fd
                    return
        from .errors import RemoteError
        raise RemoteError(self.url, f"the cached copy was evicted {_MAX_REFETCH} times before it could be read: "
                                    f"cache_limit is too small for the shards read at once")

    def read_all(self) -> bytes:
        """The whole copy (read while pinned)."""
        return self(self._size, 0)

    def close(self) -> None:
        """Nothing to release (no descriptor is kept)."""


class RangePread:
    """Byte ranges of a remote object through ranged GETs (Energon tars: no whole-tar download).

    fetcher: a ``fetch.Fetcher``. url: the object. size: its size in bytes.
    """

    def __init__(self, fetcher, url: str, size: int):
        self.fetcher, self.url, self._size = fetcher, url, size

    def size(self) -> int:
        return self._size

    def __call__(self, n: int, at: int) -> bytes:
        end = min(at + n, self._size)
        return self.fetcher.get(self.url, at, end) if end > at else b""

    def close(self) -> None:
        """Nothing to release."""


class RangeFile(io.RawIOBase):
    """A read-only seekable file over a remote object, reading blocks of ``block`` bytes by range (the last
    ``keep`` blocks cached). Thread-safe for pyarrow's use (reads are serialised).

    fetcher: a ``fetch.Fetcher``. url: the object. size: its size. block: bytes per range read.
    """

    def __init__(self, fetcher, url: str, size: int, block: int = 4 << 20, keep: int = 4):
        super().__init__()
        self.fetcher, self.url, self._size = fetcher, url, size
        self.block, self.keep = block, keep
        self._pos = 0
        self._blocks: OrderedDict[int, bytes] = OrderedDict()
        self._lock = threading.Lock()
        self.name = url

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._pos

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._pos, io.SEEK_END: self._size}[whence]
        self._pos = max(0, base + offset)
        return self._pos

    def size(self) -> int:
        return self._size

    def _block(self, b: int) -> bytes:
        data = self._blocks.get(b)
        if data is None:
            start = b * self.block
            data = self.fetcher.get(self.url, start, min(start + self.block, self._size))
            self._blocks[b] = data
            while len(self._blocks) > self.keep:
                self._blocks.popitem(last=False)
        else:
            self._blocks.move_to_end(b)
        return data

    def read(self, n: int = -1) -> bytes:
        with self._lock:
            end = self._size if n is None or n < 0 else min(self._size, self._pos + n)
            if end <= self._pos:
                return b""
            if end - self._pos > self.block * self.keep:  # a large read (a row group): one request
                data = self.fetcher.get(self.url, self._pos, end)
            else:
                parts = []
                at = self._pos
                while at < end:
                    b = at // self.block
                    blk = self._block(b)
                    off = at - b * self.block
                    take = blk[off:off + (end - at)]
                    parts.append(take)
                    at += len(take)
                    if not take:
                        break
                data = b"".join(parts)
            self._pos += len(data)
            return data

    def readinto(self, buf) -> int:
        data = self.read(len(buf))
        buf[:len(data)] = data
        return len(data)

    def readall(self) -> bytes:
        return self.read(-1)
