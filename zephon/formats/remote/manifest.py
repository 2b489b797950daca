"""The manifest of a cache folder: which remote it belongs to and, per cached file, where it came from.

``.zephon-manifest.json`` beside the files (readable JSON, documented in docs/remote.md)::

    {"format": "zephon-cache-manifest", "version": 1, "remote": "s3://bucket/prefix",
     "files": {"shard.00000.mds": {"url": "s3://bucket/prefix/shard.00000.mds", "etag": "9b2c...",
                                   "size": 67108864, "hashes": {"sha1": "..."}}}}

A cached file is served only when its entry matches what the remote's listing or index says now (``matches``);
eviction removes only files listed here. The file is rewritten whole (temporary file + ``os.replace``) under
a lock, so readers in other processes see the old or the new manifest, never a torn one.
"""
from __future__ import annotations

import json
import os

from ..fileio import atomic_writer
from .errors import RemoteError

NAME = ".zephon-manifest.json"
FORMAT = "zephon-cache-manifest"
VERSION = 1


class CacheConflict(RemoteError):
    """A cache folder bound to one remote source was opened for another (``local`` shared by two datasets)."""


class ObjectChanged(RemoteError):
    """An object changed under a running pass: its ETag now differs from the one the dataset was opened with.

    url: the object. old / new: the ETags (opened with / found now).
    """

    def __init__(self, url: str, old: str, new: str, attempts: int = 1):
        self.old, self.new = old, new
        super().__init__(url, f"the object changed while the dataset was read (ETag {old} when opened, {new} now): "
                              f"the dataset was rewritten in place during the pass; reopen it to read the new "
                              f"version", attempts)

    def __reduce__(self):
        return (type(self), (self.url, self.old, self.new, self.attempts))


def identity(url: str, size: int, etag: str | None = None, hashes: dict | None = None) -> dict:
    """A manifest entry: the object ``url``, its ``size`` in bytes, ``etag`` ("" unknown) and ``hashes``
    (algorithm -> hex digest, from an index; {} when none)."""
    return {"url": url, "etag": etag or "", "size": int(size),
            "hashes": {k: v.lower() for k, v in (hashes or {}).items()}}


def matches(entry: dict | None, want: dict) -> bool:
    """Whether manifest ``entry`` describes the object ``want`` (an ``identity``): same URL and size, the same
    ETag when both are known, the same digest for every algorithm both record; and at least one of ETag or
    hash agrees when ``want`` has any (size alone is not an identity when more is known)."""
    if not entry or entry.get("url") != want["url"] or entry.get("size") != want["size"]:
        return False
    etag, have = want["etag"], entry.get("etag") or ""
    if etag and have and etag != have:
        return False
    common = set(want["hashes"]) & set(entry.get("hashes") or {})
    if any(entry["hashes"][a] != want["hashes"][a] for a in common):
        return False
    if etag or want["hashes"]:
        return bool((etag and have) or common)
    return True


class Manifest:
    """The manifest of cache folder ``root`` (read again only when its file changed). Not thread-safe by
    itself: writers hold the cache's manifest lock (``LocalCache.manifest_lock``)."""

    def __init__(self, root: str):
        self.path = os.path.join(root, NAME)
        self._seen, self._data = None, None

    def load(self) -> dict:
        """The manifest as a dict (an empty one when the file is missing). Raises RemoteError when it is not
        a manifest (naming the file)."""
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            return {"format": FORMAT, "version": VERSION, "remote": None, "files": {}}
        key = (st.st_ino, st.st_mtime_ns, st.st_size)
        if key != self._seen:
            try:
                with open(self.path, encoding="utf-8") as f:
                    data = json.load(f)
            except (OSError, ValueError) as e:
                raise RemoteError(self.path, f"the cache manifest cannot be read ({e}); remove the cache folder "
                                             f"to start afresh") from None
            if not isinstance(data, dict) or data.get("format") != FORMAT or not isinstance(data.get("files"), dict):
                raise RemoteError(self.path, "not a Zephon cache manifest; remove the cache folder to start afresh")
            self._seen, self._data = key, data
        return self._data

    def entry(self, rel: str) -> dict | None:
        """The entry of cached file ``rel`` (None when the cache does not own it)."""
        return self.load()["files"].get(rel)

    def save(self, data: dict) -> None:
        """Write ``data`` atomically (call under the manifest lock)."""
        with atomic_writer(self.path, durable=False) as f:
            f.write(json.dumps(data, indent=1, sort_keys=True).encode())
