"""Positional file reads shared by the shard readers (JSONL, MDS, Energon tars).

``PreadFile`` is a read-only file descriptor read with ``os.pread`` (no shared file position, so
threads can share one reader); ``coalesce_runs`` groups the samples of one read call into as few
reads as possible.
"""
from __future__ import annotations

import os
import threading
from typing import Iterator, Sequence

import numpy as np

MAX_SPAN = 16 << 20  # coalesce neighbouring samples into one read up to this many bytes


def coalesce_runs(ids: Sequence[int], offsets: np.ndarray, max_span: int = MAX_SPAN) -> Iterator[tuple[int, int]]:
    """Split sorted unique sample ids into runs of consecutive ids spanning at most ``max_span`` bytes.

    offsets: sample ``i`` is the bytes ``[offsets[i], offsets[i + 1])``. Yields inclusive ``(first,
    last)`` id pairs covering exactly ``ids``, in order; nothing for empty ``ids``. A single sample
    larger than ``max_span`` is still one run.
    """
    if not ids:
        return
    a = prev = ids[0]
    for i in ids[1:]:
        if i == prev + 1 and offsets[i + 1] - offsets[a] <= max_span:
            prev = i
            continue
        yield a, prev
        a = prev = i
    yield a, prev


class PreadFile:
    """A read-only file read by position; thread-safe, callable as ``pread(n, at)``.

    path: the file. lazy: open on the first read instead of now (then OSError surfaces there).
    ``close()`` releases the descriptor; a later read reopens it. Closed when garbage-collected.
    """

    def __init__(self, path: str, *, lazy: bool = False):
        self.path = path
        self._fd: int | None = None
        self._lock = threading.Lock()
        if not lazy:
            self._open()

    def _open(self) -> int:
        with self._lock:
            if self._fd is None:
                self._fd = os.open(self.path, os.O_RDONLY | getattr(os, "O_BINARY", 0))
            return self._fd

    def size(self) -> int:
        """Current size of the open file in bytes."""
        return os.fstat(self._fd if self._fd is not None else self._open()).st_size

    def __call__(self, n: int, at: int) -> bytes:
        """Up to ``n`` bytes at byte offset ``at`` (fewer at the end of the file)."""
        fd = self._fd if self._fd is not None else self._open()
        if hasattr(os, "pread"):
            return os.pread(fd, n, at)
        with self._lock:  # no pread (Windows): serialise seek + read
            os.lseek(fd, at, os.SEEK_SET)
            return os.read(fd, n)

    def close(self) -> None:
        """Release the file descriptor (reopened if the file is read again)."""
        with self._lock:
            if self._fd is not None:
                os.close(self._fd)
                self._fd = None

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass
