"""Compression codecs: one table for JSONL files and MDS shards, with corruption turned into DataError.

``CODECS`` names each codec once (``gzip``, ``zstd``, ``bz2``, ``brotli``, ``snappy``) with the spellings the
hosts use for it: file extensions (JSONL, ``a.jsonl.gz``) and the name in an MDS ``index.json`` (``"gz"``,
``"br"``, ...). ``iter_blocks`` streams a file's decompressed bytes with bounded memory (line indexes, MDS
decompression). Random access into a gzip or single-frame zstd stream is impossible without decompressing
from the start, so JSONL readers of compressed files hold the whole decompressed shard in memory
(``load_decompressed``); a tiny per-process LRU keeps at most ``MAX_DECOMPRESSED`` of them alive.
"""
from __future__ import annotations

import bz2
import gzip
import importlib
import os
import threading
import zlib
from collections import OrderedDict
from dataclasses import dataclass
from typing import BinaryIO, Callable, Iterator

import zstandard

from .errors import DataError

BLOCK_SIZE = 4 << 20           # decompressed/plain bytes handed out per block
_INPUT_BLOCK = 256 << 10       # compressed bytes fed per step: caps one block's output at ratio * 256 KiB
_ZSTD_INPUT_BLOCK = _INPUT_BLOCK  # the same for zstd (its own name: tests shrink it to split frames)
MAX_DECOMPRESSED = 2           # decompressed shards kept per process (2: two alternating shards don't thrash)


class _Corrupt(Exception):
    """Raised by a codec's block reader for bad data; ``iter_blocks`` turns it into a DataError naming the file."""


@dataclass(frozen=True)
class Codec:
    """One compression family and every host spelling of it.

    name: our name (in messages and ``codec=`` arguments). extensions: file name endings that mark a
    compressed JSONL file (lower case, with the dot). mds_name: its name in an MDS ``index.json``
    ``compression`` field (then optionally ``":level"``). levels: the levels MDSWriter accepts after the colon.
    blocks: ``blocks(binary file, block_size in bytes) -> iterator of decompressed byte blocks``; raises
    ``_Corrupt`` for bad or truncated data.
    """
    name: str
    extensions: tuple[str, ...]
    mds_name: str
    levels: range | tuple
    blocks: Callable[[BinaryIO, int], Iterator[bytes]]


def _gzip_blocks(fh: BinaryIO, block_size: int) -> Iterator[bytes]:
    try:
        with gzip.GzipFile(fileobj=fh) as gz:  # handles multi-member files, zero padding, and checks CRCs
            while block := gz.read(block_size):
                yield block
    except (EOFError, gzip.BadGzipFile, zlib.error) as e:
        raise _Corrupt(str(e)) from None


def _stream_blocks(fh: BinaryIO, new: Callable, errors: tuple, unit: str, input_block: int) -> Iterator[bytes]:
    """Decompress one stream after another (zstd frames, bz2 streams) with ``new()`` decompress objects.

    A decompress object per stream, not a file reader: its ``eof`` tells whether the last stream was
    complete, so a truncated file is an error instead of silently shorter data.
    """
    dobj, pending = new(), False
    try:
        while chunk := fh.read(input_block):
            while chunk:
                out = dobj.decompress(chunk)
                if out:
                    yield out
                if dobj.eof:  # stream done; the rest of this chunk starts the next one
                    chunk, dobj, pending = dobj.unused_data, new(), False
                else:
                    chunk, pending = b"", True
    except errors as e:
        raise _Corrupt(str(e)) from None
    if pending:
        raise _Corrupt(f"the last {unit} is incomplete")


def _zstd_blocks(fh: BinaryIO, block_size: int) -> Iterator[bytes]:
    # Corruption inside a zstd frame without a checksum cannot always be detected here.
    yield from _stream_blocks(fh, zstandard.ZstdDecompressor().decompressobj, (zstandard.ZstdError,), "frame",
                              _ZSTD_INPUT_BLOCK)


def _bz2_blocks(fh: BinaryIO, block_size: int) -> Iterator[bytes]:
    yield from _stream_blocks(fh, bz2.BZ2Decompressor, (OSError, EOFError, ValueError), "stream", _INPUT_BLOCK)


def _optional(module: str, package: str):
    try:
        return importlib.import_module(module)
    except ImportError:
        raise ImportError(f"{module}-compressed data needs the {package!r} package (pip install {package})") from None


def _brotli_blocks(fh: BinaryIO, block_size: int) -> Iterator[bytes]:
    brotli = _optional("brotli", "brotli")
    dobj, finished = brotli.Decompressor(), True
    try:
        while chunk := fh.read(_INPUT_BLOCK):
            out = dobj.process(chunk)
            if out:
                yield out
            finished = dobj.is_finished()
    except brotli.error as e:
        raise _Corrupt(str(e)) from None
    if not finished:
        raise _Corrupt("the stream ends early")


def _snappy_blocks(fh: BinaryIO, block_size: int) -> Iterator[bytes]:
    snappy = _optional("snappy", "python-snappy")
    try:  # MDS writes one raw snappy block (no framing), so there is no streaming decoder for it
        yield snappy.decompress(fh.read())
    except Exception as e:  # snappy.UncompressError and friends
        raise _Corrupt(f"{type(e).__name__}: {e}") from None


CODECS: dict[str, Codec] = {c.name: c for c in (
    Codec("gzip", (".gz",), "gz", range(10), _gzip_blocks),
    Codec("zstd", (".zst", ".zstd"), "zstd", range(1, 23), _zstd_blocks),
    Codec("bz2", (), "bz2", range(1, 10), _bz2_blocks),
    Codec("brotli", (), "br", range(12), _brotli_blocks),
    Codec("snappy", (), "snappy", (), _snappy_blocks),
)}
FILE_EXTENSIONS: tuple[str, ...] = tuple(e for c in CODECS.values() for e in c.extensions)
_BY_MDS_NAME = {c.mds_name: c for c in CODECS.values()}


def codec_of(path: str) -> str | None:
    """Codec name by file extension (case-insensitive): ``"gzip"`` (.gz), ``"zstd"`` (.zst/.zstd) or ``None``."""
    lower = os.fspath(path).lower()
    for c in CODECS.values():
        if lower.endswith(c.extensions):
            return c.name
    return None


def mds_codec(compression: str) -> tuple[Codec, int | None]:
    """The codec and level of an MDS ``compression`` field such as ``"zstd"``, ``"zstd:7"`` or ``"gz"``.

    compression: the field's text (``family`` or ``family:level``). Returns ``(Codec, level or None)``.
    Raises ValueError for an unknown family or a level MDSWriter would not accept for it.
    """
    family, _, level = compression.partition(":")
    codec = _BY_MDS_NAME.get(family)
    if codec is None:
        raise ValueError(f"unknown compression {compression!r} (MDS offers: {', '.join(sorted(_BY_MDS_NAME))}, "
                         f"optionally with ':level')")
    if not level:
        return codec, None
    if not (level.isdigit() and int(level) in codec.levels):
        raise ValueError(f"compression {compression!r}: bad level for {family}")
    return codec, int(level)


def iter_blocks(path: str, block_size: int | None = None, *, codec: str | None = "auto") -> Iterator[bytes]:
    """Yield the (decompressed) content of ``path`` as consecutive byte blocks.

    path: the file. block_size: about this many bytes per block for plain and gzip files (None =
    ``BLOCK_SIZE``); other codecs yield what each compressed input step of 256 KiB decompresses to.
    codec: ``"auto"`` (by extension, ``codec_of``), None (plain bytes) or a name in ``CODECS``.
    Raises DataError naming the file for a truncated or corrupt stream, OSError (FileNotFoundError,
    PermissionError, ...) for files that cannot be opened, ImportError when an optional codec package
    (brotli, python-snappy) is missing, and ValueError for an unknown codec name.
    """
    name = codec_of(path) if codec == "auto" else codec
    if name is not None and name not in CODECS:
        raise ValueError(f"unknown codec {name!r} (one of: {', '.join(CODECS)})")
    block_size = block_size or BLOCK_SIZE
    with open(path, "rb") as fh:
        if name is None:
            while block := fh.read(block_size):
                yield block
            return
        try:
            yield from CODECS[name].blocks(fh, block_size)
        except _Corrupt as e:
            raise DataError(f"truncated or corrupt {name} stream: {e}", path=path) from None


_cache: OrderedDict[tuple, bytes] = OrderedDict()
_cache_lock = threading.Lock()


def _after_fork_in_child():
    # A fork while another thread decompresses would leave the lock held forever in the child.
    global _cache_lock
    _cache_lock = threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


def load_decompressed(path: str) -> bytes:
    """The whole decompressed content of ``path`` (codec by extension), cached per process (LRU of
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
