"""On-disk cache of per-file int64 index arrays (JSONL line offsets), so reopening a dataset is cheap.

Where: next to the data as a hidden ``.{filename}.zephon-idx.npz`` when that directory is writable,
else in ``cache_dir`` (default ``$ZEPHON_CACHE_DIR`` or ``~/.cache/zephon``) under a name keyed by a
hash of the absolute path. Validity: the entry stores a format version, the data file's size and mtime_ns,
and a SHA-256 digest of its first and last ``EDGE_BLOCK`` bytes (the whole file when it is smaller than
two blocks); any mismatch means rebuild. The digest catches a file replaced by another of the same size
and mtime (a copy with ``cp -p``, a restored backup, a coarse-mtime file system) for the cost of two
64 KiB reads; a change confined to the middle of a larger file with size and mtime kept is not seen.
Files are plain ``.npz`` read with ``allow_pickle=False`` (never pickle) and written atomically
(``fileio.atomic_writer``: temporary file + rename) so concurrent processes are safe: readers see
either the old or the new complete file.
"""
from __future__ import annotations

import hashlib
import os
import threading
import zipfile
from typing import Callable

import numpy as np

from .fileio import atomic_writer

VERSION = 2  # bump when the meaning of the stored arrays changes (2: stamp with the edge-block digest)
EDGE_BLOCK = 64 << 10  # bytes hashed at each end of the file for the stamp


def default_cache_dir() -> str:
    """``$ZEPHON_CACHE_DIR`` if set, else ``~/.cache/zephon`` (read at call time, not import time)."""
    return os.environ.get("ZEPHON_CACHE_DIR") or os.path.join(os.path.expanduser("~"), ".cache", "zephon")


def sidecar_path(path: str) -> str:
    """The hidden cache file next to the data file ``path``."""
    d, name = os.path.split(os.path.abspath(path))
    return os.path.join(d, f".{name}.zephon-idx.npz")


def fallback_path(path: str, cache_dir: str | None) -> str:
    """The cache file for ``path`` inside ``cache_dir`` (None = ``default_cache_dir()``)."""
    ap = os.path.abspath(path)
    digest = hashlib.sha256(ap.encode("utf-8", "surrogateescape")).hexdigest()[:32]
    return os.path.join(cache_dir or default_cache_dir(), f"{digest}-{os.path.basename(ap)}.zephon-idx.npz")


def edge_digest(path: str, size: int, block: int = EDGE_BLOCK) -> bytes:
    """16 bytes of the SHA-256 digest of the first and last ``block`` bytes of ``path`` (of all of it when
    ``size <= 2 * block``). size: the file's size in bytes (from the same ``stat`` as the stamp)."""
    h = hashlib.sha256()  # faster than blake2b where the CPU has SHA instructions
    with open(path, "rb") as f:
        if size <= 2 * block:
            h.update(f.read())
        else:
            h.update(f.read(block))
            f.seek(size - block)
            h.update(f.read(block))
    return h.digest()[:16]


def _stamp(path: str, kind: str) -> np.ndarray:
    """Validity stamp of ``path``'s index of type ``kind``: int64 ``[VERSION, size, mtime_ns, kind code,
    edge digest as two int64]``."""
    st = os.stat(path)
    kind_code = int.from_bytes(hashlib.sha256(kind.encode()).digest()[:7], "little")
    edges = np.frombuffer(edge_digest(path, st.st_size), dtype="<i8")
    return np.array([VERSION, st.st_size, st.st_mtime_ns, kind_code, *edges.tolist()], dtype=np.int64)


_load_lock = threading.Lock()  # np.load parses headers with ast, not thread-safe on CPython 3.11 (gh-106905)


def _load(cache_file: str, stamp: np.ndarray) -> np.ndarray | None:
    try:
        with _load_lock, np.load(cache_file, allow_pickle=False) as z:
            if np.array_equal(z["stamp"], stamp):
                return z["index"]
    except (OSError, KeyError, ValueError, EOFError, zipfile.BadZipFile):
        pass  # missing, stale format or damaged: treat as a miss and rebuild
    return None


def _save(cache_file: str, index: np.ndarray, stamp: np.ndarray) -> bool:
    try:
        os.makedirs(os.path.dirname(cache_file), exist_ok=True)
        # not durable: a cache lost in a crash is rebuilt, and a damaged one fails to load (a miss)
        with atomic_writer(cache_file, durable=False) as f:
            np.savez(f, index=index, stamp=stamp)
        return True
    except OSError:
        return False


def load_or_build(path: str, kind: str, build: Callable[[], np.ndarray],
                  cache_dir: str | None = None) -> tuple[np.ndarray, str | None]:
    """The cached index array of ``path``, or ``build()`` it and store it.

    kind: names the index type (part of the validity stamp). build: returns a 1-D int64 array.
    cache_dir: the fallback directory (see the module). Returns ``(index, cache_file)``: cache_file is the
    index file the array was loaded from, None when it was built now (a loaded one may be stale after an
    edit confined to the middle of the file with size and mtime kept: errors name it).
    Errors from ``build`` propagate; a cache that cannot be written is silently skipped (the index
    is then rebuilt on every open). If the file changes while being indexed, the result is returned
    but not stored. OSError when ``path`` cannot be read.
    """
    stamp = _stamp(path, kind)
    candidates = (sidecar_path(path), fallback_path(path, cache_dir))
    for cache_file in candidates:
        index = _load(cache_file, stamp)
        if index is not None:
            return index, cache_file
    index = np.ascontiguousarray(build(), dtype=np.int64)
    if np.array_equal(_stamp(path, kind), stamp):
        for cache_file in candidates:
            if _save(cache_file, index, stamp):
                break
    return index, None
