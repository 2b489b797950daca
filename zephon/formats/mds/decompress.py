"""Decompressed copies of compressed MDS shards, made once per cache directory and shared by processes.

A compressed shard (``zip_data`` in index.json) is one stream of a codec from ``zephon.formats.codecs``.
Random access needs the raw bytes, so it is decompressed once into ``<cache_dir>/mds/`` (atomic write:
reused by later opens and other processes; never evicted: delete that directory to reclaim the space)
or, when the cache cannot be written, held in memory.
"""
from __future__ import annotations

import contextlib
import hashlib
import json
import os
import threading

from ..codecs import iter_blocks, mds_codec
from ..errors import DataError
from ..fileio import atomic_writer
from ..index_cache import default_cache_dir
from .index import ShardMeta

_key_locks: dict = {}
_key_locks_lock = threading.Lock()


def _lock_for(key) -> threading.Lock:
    with _key_locks_lock:
        return _key_locks.setdefault(key, threading.Lock())


def decompressed_path(meta: ShardMeta, cache_dir: str | None) -> str:
    """Where the decompressed copy of a compressed shard lives: ``<cache_dir>/mds/<key>-<raw basename>``.

    meta: the shard's index entry (compressed). cache_dir: None = ``default_cache_dir()``. key: hash of
    the compressed file's absolute path, size, mtime and the index's raw entry, so a changed shard or
    index gets a new copy. Raises OSError when the compressed file cannot be stat'ed.
    """
    st = os.stat(meta.zip_path)
    ident = json.dumps([os.path.abspath(meta.zip_path), st.st_size, st.st_mtime_ns, meta.raw.basename,
                        meta.raw.bytes, meta.raw.hashes, meta.compression], sort_keys=True)
    digest = hashlib.sha256(ident.encode("utf-8", "surrogateescape")).hexdigest()[:32]
    return os.path.join(cache_dir or default_cache_dir(), "mds", f"{digest}-{meta.raw.basename}")


def decompress_shard(meta: ShardMeta, cache_dir: str | None, shard: int | None) -> tuple[str | None, bytes | None]:
    """The raw bytes of a compressed shard: ``(path of the decompressed copy, None)``, or ``(None, data)``
    when the cache directory is not writable.

    meta: the shard's index entry (compressed). cache_dir: see ``decompressed_path``. shard: shard id for
    messages. Decompresses once per cache directory: later calls and other processes reuse the copy.
    Raises DataError naming the compressed file and shard for corrupt data or a decompressed size other
    than ``raw_data.bytes``; OSError when the compressed file cannot be read.
    """
    target = decompressed_path(meta, cache_dir)
    with _lock_for(target):
        try:
            if os.path.getsize(target) == meta.raw.bytes:
                return target, None
        except OSError:
            pass
        codec, _ = mds_codec(meta.compression)
        with contextlib.ExitStack() as stack:
            try:
                os.makedirs(os.path.dirname(target), exist_ok=True)
                # durable: a copy is reused on its size alone, so it must not survive a crash half written
                f = stack.enter_context(atomic_writer(target))
            except OSError:
                f = None  # cache not writable: hold the shard in memory instead
            size, parts = 0, []
            try:
                for block in iter_blocks(meta.zip_path, codec=codec.name):
                    size += len(block)
                    if size > meta.raw.bytes:  # stop early: a bad stream must not fill the disk
                        raise DataError(f"decompresses to more than raw_data.bytes={meta.raw.bytes} bytes",
                                        path=meta.zip_path)
                    if f is not None:
                        f.write(block)
                    else:
                        parts.append(block)
            except DataError as e:
                raise e.located(shard=shard) from None
            if size != meta.raw.bytes:
                raise DataError(f"decompresses to {size} bytes, index.json says raw_data.bytes={meta.raw.bytes}",
                                path=meta.zip_path, shard=shard)
        return (target, None) if f is not None else (None, b"".join(parts))
