"""The local cache of a remote source: one directory shared by the threads and processes of a node.

- A file appears whole or not at all: it is written to a temporary file beside it and renamed into place
  (``fileio.atomic_writer``); a reader never sees a partial download.
- One download per file at a time: a per-file lock (``fcntl.flock`` on ``.zephon-locks/<hash>.lock``, plus a
  thread lock) is held while it is fetched; whoever waited then finds the file there.
- ``limit`` (bytes, Mosaic's ``cache_limit``): before a download, room is made under a cache-wide lock by
  removing the least recently used evictable files; the new file's temporary copy is created at its full size
  under that same lock, so downloads in flight count against the limit and the directory never holds more
  than ``limit`` bytes of shards. Evictable and counted: shard files the manifest lists (``manifest``: the
  cache downloaded them), not index.json, ``.tar.idx``, ``.nv-meta/`` or hidden files (small metadata, as
  Mosaic's limit counts its shard cache only); any other file under the folder is never touched.
- The folder is bound to one remote source (``bind``); temporary files of dead processes are removed at open.
- A file in use is never evicted: readers hold a shared ``flock`` on it while they read (``pinned``); eviction
  takes an exclusive one without waiting and skips the file when that fails. Recency is the file's atime,
  which readers set when they use it.
What is cached changes speed only: readers re-fetch an evicted file, the same bytes, checked again.
"""
from __future__ import annotations

import contextlib
import hashlib
import os
import re
import secrets
import threading
import time
import warnings
from typing import Iterator

try:
    import fcntl
except ImportError:  # pragma: no cover - not POSIX: one process per cache directory
    fcntl = None

from ..errors import DataWarning
from ..fileio import atomic_writer, pid_alive
from .errors import RemoteError
from .manifest import CacheConflict, Manifest

LOCK_DIR = ".zephon-locks"
_METADATA_NAMES = ("index.json",)
_METADATA_SUFFIXES = (".tar.idx", ".lock")
_TMP = re.compile(r"^\.(.+)\.(\d+)\.[0-9a-f]{8}\.tmp$")   # fileio.atomic_writer's temporary names (and scratch)
_POLL = 0.02        # seconds between tries of a lock held elsewhere
_thread_locks: dict = {}
_mode = threading.local()   # no_eviction: this thread's downloads take free room only
_thread_locks_guard = threading.Lock()


class CacheFull(RemoteError):
    """``cache_limit`` leaves no room for a file (too small, or everything else is in use)."""


def evictable(rel: str) -> bool:
    """Whether the cached file at relative path ``rel`` may be evicted (a shard, not metadata or a hidden file)."""
    parts = rel.replace(os.sep, "/").split("/")
    return not any(p.startswith(".") for p in parts) and parts[-1] not in _METADATA_NAMES and \
        not parts[-1].endswith(_METADATA_SUFFIXES)


@contextlib.contextmanager
def no_eviction() -> Iterator[None]:
    """Downloads of this thread inside the block never evict: without free room they raise CacheFull (what
    read-ahead wants: it must not push out what readers are about to use)."""
    before = getattr(_mode, "no_eviction", False)
    _mode.no_eviction = True
    try:
        yield
    finally:
        _mode.no_eviction = before


def _thread_lock(key: str) -> threading.Lock:
    with _thread_locks_guard:
        return _thread_locks.setdefault(key, threading.Lock())


@contextlib.contextmanager
def _flock(path: str, wait: float, what: str) -> Iterator[None]:
    """Exclusive lock file ``path`` (thread and process), waiting at most ``wait`` seconds."""
    with _thread_lock(path):
        if fcntl is None:
            yield
            return
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
        try:
            deadline = time.monotonic() + wait
            while True:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    if time.monotonic() > deadline:
                        raise RemoteError(what, f"another process has held the lock {path} for more than {wait:g}s "
                                                f"(a download that hangs?); remove the lock file if no process "
                                                f"uses this cache") from None
                    time.sleep(_POLL)
            yield
        finally:
            os.close(fd)  # releases the flock


class LocalCache:
    """A cache directory. root: the directory (created). limit: bytes or None (no eviction). wait: seconds a
    thread waits for another's download of the same file, or for room held by files in use. Picklable."""

    def __init__(self, root: str, limit: int | None = None, wait: float = 600.0):
        self.root, self.limit, self.wait = os.path.abspath(root), limit, float(wait)
        os.makedirs(os.path.join(self.root, LOCK_DIR), exist_ok=True)
        self.manifest = Manifest(self.root)
        self.sweep()

    def sweep(self) -> int:
        """Remove the temporary files that dead processes left (their pid is not alive and nobody holds the
        download lock of their file); returns how many. Run at every open, with or without ``limit``."""
        removed = 0
        for rel, _, _ in self._files():
            head, _, name = rel.rpartition("/")
            m = _TMP.match(name)
            if not m or pid_alive(int(m.group(2))):
                continue
            target = f"{head}/{m.group(1)}" if head else m.group(1)
            if self._lock_free(target):
                with contextlib.suppress(OSError):
                    os.unlink(self.path(rel))
                    removed += 1
        return removed

    def _lock_free(self, rel: str) -> bool:
        if fcntl is None:
            return True
        try:
            fd = os.open(self._lock_path(rel), os.O_RDWR | os.O_CREAT, 0o666)
        except OSError:
            return False
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
        except BlockingIOError:
            return False
        finally:
            os.close(fd)

    def manifest_lock(self):
        """Context manager: the lock writers of the manifest hold."""
        return _flock(self._lock_path(".manifest"), self.wait, self.manifest.path)

    def bind(self, remote: str) -> None:
        """Bind this folder to remote source ``remote`` (first use), or check that it is bound to it.
        Raises CacheConflict naming both when the folder already belongs to another remote source."""
        with self.manifest_lock():
            data = self.manifest.load()
            if data.get("remote") in (None, remote):
                if data.get("remote") is None:
                    self._warn_foreign(remote)
                    self.manifest.save(dict(data, remote=remote))
                return
        raise CacheConflict(remote, f"the cache folder {self.root} already holds {data['remote']}; a cache "
                                    f"folder serves one remote source (give each dataset its own local=, or "
                                    f"leave local unset for a folder per URL)")

    def _warn_foreign(self, remote: str) -> None:
        """At a folder's first binding: warn when it already holds files of its own (a dataset written there, e.g. by
        ``MDSWriter``), since files of the same names from ``remote`` replace them (Mosaic's ``local`` is a cache
        too, but reads what it finds). Folders in it (datasets kept under the cache) are never touched."""
        try:
            names = sorted(n for n in os.listdir(self.root)
                           if not n.startswith(".") and os.path.isfile(os.path.join(self.root, n)))
        except OSError:
            return
        if names:
            shown = ", ".join(names[:5]) + (f" and {len(names) - 5} more" if len(names) > 5 else "")
            warnings.warn(f"the cache folder {self.root} for {remote} already holds files Zephon did not download "
                          f"({shown}): files of the same names are replaced by the remote's; give local= an empty "
                          f"or dedicated folder to keep them", DataWarning, stacklevel=4)

    def entry(self, rel: str) -> dict | None:
        """The manifest entry of cached file ``rel`` (None: not owned by the cache)."""
        return self.manifest.entry(rel)

    def disown(self, rel: str) -> None:
        """Before ``rel`` is fetched again (call under its download lock): drop its manifest entry and remove
        the stale copy, so readers wait on the lock meanwhile and a failed download leaves no file the cache
        no longer owns. A file the manifest does not list (not the cache's) is left alone."""
        if self.entry(rel) is not None:
            self.record(rel, None)
            _unlink(self.path(rel))

    def record(self, rel: str, entry: dict | None) -> None:
        """Set (or with None remove) the manifest entry of ``rel``."""
        self.forget_all({rel: entry})

    def forget_all(self, entries: dict) -> None:
        """Set or remove (value None) several manifest entries at once, ``{rel: entry or None}``."""
        with self.manifest_lock():
            data = self.manifest.load()
            files = dict(data["files"])
            for rel, e in entries.items():
                if e is None:
                    files.pop(rel, None)
                else:
                    files[rel] = e
            self.manifest.save(dict(data, files=files))

    def __repr__(self):
        return f"LocalCache({self.root!r}, limit={self.limit})"

    def path(self, rel: str) -> str:
        """Absolute path of cached file ``rel`` (a ``/``-separated path below the root)."""
        return os.path.join(self.root, *rel.split("/"))

    def ready(self, rel: str, size: int | None) -> bool:
        """Whether ``rel`` is present (with ``size`` bytes when given)."""
        try:
            st = os.stat(self.path(rel))
        except OSError:
            return False
        return size is None or st.st_size == size

    def _lock_path(self, name: str) -> str:
        return os.path.join(self.root, LOCK_DIR, hashlib.sha256(name.encode()).hexdigest()[:24] + ".lock")

    def lock(self, rel: str, url: str):
        """Context manager: the download lock of ``rel`` (``url`` is named if waiting for it times out)."""
        return _flock(self._lock_path(rel), self.wait, url)

    @contextlib.contextmanager
    def writing(self, files: list[tuple[str | None, int]], url: str) -> Iterator[list]:
        """Open files ``[(rel, size), ...]`` for writing after making room for their sizes under ``limit``.

        Yields binary file objects, each already ``size`` bytes long (its room held); write them from the
        start. ``rel`` None: a scratch file (readable too, removed at the end). On normal exit every other file
        becomes its ``rel`` atomically; on an exception none appears. url: named in errors.
        Raises CacheFull when no room can be made in ``wait`` seconds.
        """
        with contextlib.ExitStack() as stack:
            outs = []
            with self._space(sum(s for rel, s in files if rel is None or evictable(rel)), url):
                for rel, size in files:
                    if rel is None:
                        path = os.path.join(self.root, f".scratch.x.{os.getpid()}.{secrets.token_hex(4)}.tmp")
                        f = open(path, "w+b")
                        stack.callback(_unlink, path)
                        stack.callback(f.close)
                    else:
                        target = self.path(rel)
                        os.makedirs(os.path.dirname(target), exist_ok=True)
                        f = stack.enter_context(atomic_writer(target, durable=False))
                    f.truncate(size)  # the room is taken now, under the space lock
                    outs.append(f)
            yield outs

    @contextlib.contextmanager
    def _space(self, need: int, url: str) -> Iterator[None]:
        if self.limit is None:
            yield
            return
        if need > self.limit:
            raise CacheFull(url, f"needs {need} bytes in the cache, more than cache_limit={self.limit}")
        deadline = time.monotonic() + self.wait
        with _flock(self._lock_path("space"), self.wait, url):
            if getattr(_mode, "no_eviction", False):
                used = self.usage()
                if used + need > self.limit:
                    raise CacheFull(url, f"read-ahead skipped: {need} bytes do not fit under cache_limit="
                                         f"{self.limit} without an eviction ({used} bytes cached)")
            while True:
                used, in_use = self._make_room(need)
                if used + need <= self.limit:
                    break
                if time.monotonic() > deadline:
                    raise CacheFull(url, f"no room for {need} bytes under cache_limit={self.limit}: {used} bytes "
                                         f"cached, {in_use} of them in shards being read or metadata; raise "
                                         f"cache_limit") from None
                time.sleep(_POLL)  # shards are pinned only while a read runs
            yield

    def usage(self) -> int:
        """Bytes held against ``limit``: shard files, and the temporary copies of those being written (at their
        full size from the start). Metadata (index.json, ``.tar.idx``, ``.nv-meta/``, line indexes) is not
        counted, as Mosaic counts only its shard cache."""
        owned = self.manifest.load()["files"]
        return sum(size for rel, size, _ in self._files() if _counted(rel, owned))

    def _files(self) -> list[tuple[str, int, int]]:
        """``[(rel, size, atime_ns), ...]`` of every file below the root except lock files."""
        out = []
        stack = [("", self.root)]
        while stack:
            rel_dir, d = stack.pop()
            try:
                entries = list(os.scandir(d))
            except OSError:
                continue
            for e in entries:
                rel = f"{rel_dir}/{e.name}" if rel_dir else e.name
                try:
                    if e.is_dir(follow_symlinks=False):
                        if e.name != LOCK_DIR:
                            stack.append((rel, e.path))
                    elif e.is_file(follow_symlinks=False):
                        st = e.stat(follow_symlinks=False)
                        out.append((rel, st.st_size, st.st_atime_ns))
                except OSError:
                    continue  # removed meanwhile
        return out

    def _make_room(self, need: int) -> tuple[int, int]:
        """Evict least recently used, unpinned evictable files until ``need`` more bytes fit (or nothing more
        can go). Returns ``(bytes used now, bytes that cannot be evicted)``. Called under the space lock."""
        owned = self.manifest.load()["files"]
        files = [f for f in self._files() if _counted(f[0], owned)]
        used = sum(s for _, s, _ in files)
        kept, evicted = 0, {}
        for rel, size, _ in sorted(files, key=lambda f: f[2]):
            name = rel.rsplit("/", 1)[-1]
            m = _TMP.match(name)
            if m:
                if not pid_alive(int(m.group(2))):  # left by a killed process
                    with contextlib.suppress(OSError):
                        os.unlink(self.path(rel))
                        used -= size
                else:
                    kept += size  # a download in flight
                continue
            if used + need <= self.limit:
                continue
            if _evict(self.path(rel)):
                used -= size
                evicted[rel] = None
            else:
                kept += size
        if evicted:
            self.forget_all(evicted)
        return used, kept


def _counted(rel: str, owned: dict) -> bool:
    """Whether file ``rel`` counts against the limit (and may be evicted): a shard the manifest lists, or the
    temporary copy of one being written (or a scratch file). Files the cache did not download are neither."""
    head, _, name = rel.rpartition("/")
    m = _TMP.match(name)
    if m:
        return m.group(1).startswith("scratch.") or evictable(f"{head}/{m.group(1)}" if head else m.group(1))
    return rel in owned and evictable(rel)


def _unlink(path: str) -> None:
    with contextlib.suppress(OSError):
        os.unlink(path)


def _evict(path: str) -> bool:
    """Remove ``path`` unless a reader holds it (shared flock); True when removed."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return False
    try:
        if fcntl is not None:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                return False
        os.unlink(path)
        return True
    except OSError:
        return False
    finally:
        os.close(fd)


@contextlib.contextmanager
def pinned(path: str) -> Iterator[int | None]:
    """A read-only descriptor of ``path`` that eviction leaves alone while the block runs (shared flock),
    or None when the file is not there (evicted: fetch it again). Marks the file recently used (atime)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        yield None
        return
    try:
        if fcntl is not None:
            fcntl.flock(fd, fcntl.LOCK_SH)
        st = os.fstat(fd)
        try:
            same = os.stat(path).st_ino == st.st_ino
        except FileNotFoundError:
            same = False
        if not same:  # evicted (or replaced) between open and lock
            yield None
            return
        with contextlib.suppress(OSError):
            os.utime(fd, ns=(time.time_ns(), st.st_mtime_ns))
        yield fd
    finally:
        os.close(fd)
