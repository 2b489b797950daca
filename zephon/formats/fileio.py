"""File access shared by the format readers and everything that writes files atomically.

``PreadFile`` is a read-only file descriptor read with ``os.pread`` (no shared file position, so
threads can share one reader); ``coalesce_runs`` groups the samples of one read call into as few
reads as possible, and ``pread_spans`` reads those runs (through one pin of a remote cached copy).
``atomic_write`` / ``atomic_writer`` replace a file so that readers (other threads, processes, ranks) see the
old complete file or the new complete file, never a part.
"""
from __future__ import annotations

import contextlib
import os
import secrets
import threading
from typing import BinaryIO, Iterator, Sequence

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


def pread_spans(pread, spans: Sequence[tuple[int, int]]) -> list[bytes]:
    """The bytes of each ``(start, end)`` byte span of ``pread`` (a ``pread(n, at)`` callable), in order.

    pread: a reader; one with a ``preads(spans)`` method (a remote cached copy: one pin for all the spans, not
    one per span) is asked once. spans: byte ranges, end exclusive. Returns fewer bytes for a span past the end.
    """
    many = getattr(pread, "preads", None)
    if not spans:  # nothing to read: a remote copy is not fetched for it
        return []
    if many is not None:
        return many(spans)
    return [pread(b - a, a) for a, b in spans]


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


def _fsync_dir(d: str) -> None:
    # Makes the rename itself durable; some systems cannot open or fsync a directory (Windows, some
    # network filesystems): the replace is still atomic there, only not guaranteed to survive a crash.
    try:
        fd = os.open(d, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


@contextlib.contextmanager
def atomic_writer(path: str | os.PathLike, *, durable: bool = True) -> Iterator[BinaryIO]:
    """Write ``path`` atomically through a binary file object, for content streamed in pieces.

    path: the file to create or replace; its directory must exist. durable: fsync the file before the
    rename and the directory after it, so the new content survives a crash (False for caches that
    are rebuilt when missing: atomicity alone keeps readers from torn files, and an fsync per file
    would dominate opening thousands of small files).
    Usage: ``with atomic_writer(p) as f: f.write(...)``. The content goes to a temporary file in the
    same directory (so the rename never crosses filesystems), created with mode 0666 minus the umask
    like ``open``; when the block raises, the temporary file is removed and ``path`` is untouched.
    Raises OSError when the temporary file cannot be created, written or renamed.
    """
    path = os.fspath(path)
    d, base = os.path.split(os.path.abspath(path))
    # A unique name per writer: concurrent writers of the same path each rename a whole file; last wins.
    tmp = os.path.join(d, f".{base}.{os.getpid()}.{secrets.token_hex(4)}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_BINARY", 0), 0o666)
    try:
        with os.fdopen(fd, "wb") as f:
            yield f
            f.flush()
            if durable:
                os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    if durable:
        _fsync_dir(d)


def atomic_write(path: str | os.PathLike, data: bytes | str, *, durable: bool = True) -> None:
    """Create or replace ``path`` with ``data`` atomically: readers see the old or the new file, whole.

    path: the file; its directory must exist. data: the whole content (``str`` is written as UTF-8).
    durable: fsync file and directory so the new content survives a crash (see ``atomic_writer``).
    Raises OSError when the file cannot be written.
    """
    with atomic_writer(path, durable=durable) as f:
        f.write(data.encode("utf-8") if isinstance(data, str) else data)


def pid_alive(pid: int) -> bool:
    """Whether process ``pid`` runs (a zombie, exited but not yet reaped by its parent, does not)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):  # no procfs (not Linux): kill() said it exists
        return True
