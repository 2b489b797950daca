"""Byte streams of plain, gzip and zstd files, with corruption turned into DataError.

Streaming (``iter_blocks``) is used to build line indexes with bounded memory. Random access into
a gzip or single-frame zstd stream is impossible without decompressing from the start, so readers of
compressed files hold the whole decompressed shard in memory (``load_decompressed``); a tiny
per-process LRU keeps at most ``MAX_DECOMPRESSED`` of them alive so memory stays bounded.
"""
from __future__ import annotations

import gzip
import os
import threading
import zlib
from collections import OrderedDict
from typing import Iterator

import zstandard

from .errors import DataError

BLOCK_SIZE = 4 << 20          # decompressed/plain bytes handed out per block
_ZSTD_INPUT_BLOCK = 256 << 10  # compressed bytes fed per step: caps one block's output at ratio * 256 KiB
MAX_DECOMPRESSED = 2           # decompressed shards kept per process (2: two alternating shards don't thrash)


def codec_of(path: str) -> str | None:
    """Compression codec by file extension: ``"gzip"`` (.gz), ``"zstd"`` (.zst/.zstd) or ``None``."""
    lower = path.lower()
    if lower.endswith(".gz"):
        return "gzip"
    if lower.endswith((".zst", ".zstd")):
        return "zstd"
    return None


def iter_blocks(path: str, block_size: int | None = None) -> Iterator[bytes]:
    """Yield the (decompressed) content of ``path`` as consecutive byte blocks of about
    ``block_size`` bytes (None = ``BLOCK_SIZE``).

    Raises DataError naming the file for a truncated or corrupt gzip/zstd stream, and OSError
    (FileNotFoundError, PermissionError, ...) for files that cannot be opened.
    Corruption inside a zstd frame without a checksum cannot always be detected here; it then
    usually shows up as invalid JSON.
    """
    codec = codec_of(path)
    block_size = block_size or BLOCK_SIZE
    with open(path, "rb") as fh:
        if codec is None:
            while block := fh.read(block_size):
                yield block
        elif codec == "gzip":
            yield from _gzip_blocks(path, fh, block_size)
        else:
            yield from _zstd_blocks(path, fh)


def _gzip_blocks(path, fh, block_size):
    try:
        with gzip.GzipFile(fileobj=fh) as gz:  # handles multi-member files and checks CRCs
            while block := gz.read(block_size):
                yield block
    except (EOFError, gzip.BadGzipFile, zlib.error) as e:
        raise DataError(f"truncated or corrupt gzip stream: {e}", path=path) from e


def _zstd_blocks(path, fh):
    # A decompressobj per frame: unlike stream_reader it tells us (via .eof) whether the last frame
    # was complete, so a truncated file is an error instead of silently shorter data.
    dctx = zstandard.ZstdDecompressor()
    dobj, pending = dctx.decompressobj(), False
    try:
        while chunk := fh.read(_ZSTD_INPUT_BLOCK):
            while chunk:
                out = dobj.decompress(chunk)
                if out:
                    yield out
                if dobj.eof:  # frame done; the rest of this chunk starts the next frame
                    chunk, dobj, pending = dobj.unused_data, dctx.decompressobj(), False
                else:
                    chunk, pending = b"", True
    except zstandard.ZstdError as e:
        raise DataError(f"truncated or corrupt zstd stream: {e}", path=path) from e
    if pending:
        raise DataError("truncated or corrupt zstd stream: the last frame is incomplete", path=path)


_cache: OrderedDict[tuple, bytes] = OrderedDict()
_cache_lock = threading.Lock()


def _after_fork_in_child():
    # A fork while another thread decompresses would leave the lock held forever in the child.
    global _cache_lock
    _cache_lock = threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


def load_decompressed(path: str) -> bytes:
    """The whole decompressed content of ``path`` (``bytes``), cached per process (LRU of
    ``MAX_DECOMPRESSED`` entries keyed by path, size and mtime). Raises like ``iter_blocks``."""
    st = os.stat(path)
    key = (path, st.st_size, st.st_mtime_ns)
    # Held while decompressing so concurrent threads wanting the same shard wait instead of each
    # holding a private copy (which would break the memory bound).
    with _cache_lock:
        if key in _cache:
            _cache.move_to_end(key)
            return _cache[key]
        # Evict first so the old shard is freed before the new one is allocated.
        while len(_cache) >= MAX_DECOMPRESSED:
            _cache.popitem(last=False)
        data = b"".join(iter_blocks(path))
        if MAX_DECOMPRESSED > 0:
            _cache[key] = data
        return data


def clear_cache() -> None:
    """Drop all cached decompressed shards of this process."""
    with _cache_lock:
        _cache.clear()
