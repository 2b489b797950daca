"""Object URLs: which sources are remote, and joining, naming and matching object keys.

A remote source is a URL whose scheme is in ``SCHEMES``: ``s3://bucket/key`` (boto3, any S3-compatible
server), ``gs://bucket/key`` (through fsspec's gcsfs when it is installed), ``msc://profile/path`` (NVIDIA's
Multi-Storage Client when it is installed, as Energon uses it), and any other protocol fsspec knows when it is
asked for explicitly (the tests use ``memory://``). ``file://`` is a local path. See docs/remote.md.
"""
from __future__ import annotations

import fnmatch
import hashlib
import os
import posixpath
import re

SCHEMES = ("s3", "gs", "gcs", "msc")
_URL = re.compile(r"^([a-zA-Z][a-zA-Z0-9+.-]*)://(.*)$")
_SIZE = re.compile(r"^\s*([0-9]*\.?[0-9]+)\s*([kmgtp]?)(i?b?)\s*$", re.IGNORECASE)
FSSPEC_SCHEMES: set[str] = set()   # extra protocols routed to fsspec (tests register "memory")


def scheme_of(source) -> str | None:
    """The URL scheme of ``source`` (lower case), or None for a plain path or a non-string."""
    if not isinstance(source, (str, os.PathLike)):
        return None
    m = _URL.match(os.fspath(source))
    return m.group(1).lower() if m else None


def is_remote(source) -> bool:
    """Whether ``source`` is an object-storage URL this package reads (``SCHEMES`` or a registered fsspec one)."""
    s = scheme_of(source)
    return s is not None and (s in SCHEMES or s in FSSPEC_SCHEMES)


def local_path(source):
    """``source`` with a ``file://`` prefix removed (other values unchanged)."""
    if isinstance(source, str) and source.startswith("file://"):
        return source[len("file://"):]
    return source


def split_url(url: str) -> tuple[str, str, str]:
    """``(scheme, bucket or profile, key)`` of ``url``; key has no leading slash and may be empty.

    Raises ValueError for a string that is not a URL or names no bucket.
    """
    m = _URL.match(url)
    if not m:
        raise ValueError(f"not an object URL: {url!r}")
    scheme, rest = m.group(1).lower(), m.group(2)
    bucket, _, key = rest.partition("/")
    if not bucket:
        raise ValueError(f"no bucket in {url!r} (expected {scheme}://bucket/key)")
    return scheme, bucket, key.lstrip("/")


def join(url: str, *parts: str) -> str:
    """``url`` with path ``parts`` appended (``/``-separated, empty parts skipped, no ``..`` resolution)."""
    out = url.rstrip("/")
    for p in parts:
        if p:
            out += "/" + p.strip("/")
    return out


def basename(url: str) -> str:
    """Last path component of ``url`` (``s3://b/d/x.mds`` -> ``x.mds``)."""
    return posixpath.basename(url.rstrip("/"))


def dirname(url: str) -> str:
    """``url`` without its last path component."""
    return url.rstrip("/").rsplit("/", 1)[0]


def relative(url: str, prefix: str) -> str:
    """Path of ``url`` below the ``prefix`` URL (``s3://b/d/``, ``s3://b/d/x/y`` -> ``x/y``)."""
    p = prefix.rstrip("/") + "/"
    return url[len(p):] if url.startswith(p) else basename(url)


def has_magic(url: str) -> bool:
    """Whether ``url``'s key holds glob characters (``* ? [``)."""
    return any(c in split_url(url)[2] for c in "*?[")


def glob_prefix(url: str) -> str:
    """The longest directory of ``url`` without glob characters (the prefix to list for a pattern)."""
    scheme, bucket, key = split_url(url)
    parts = key.split("/")
    fixed = []
    for p in parts:
        if any(c in p for c in "*?["):
            break
        fixed.append(p)
    return f"{scheme}://{bucket}/" + "/".join(fixed)


def glob_match(url: str, pattern: str) -> bool:
    """Whether object ``url`` matches the glob ``pattern`` URL (``*`` stays within one path level, ``**``
    spans levels, as ``glob.glob(recursive=True)``)."""
    rx = ""
    i = 0
    while i < len(pattern):
        if pattern.startswith("**/", i):
            rx, i = rx + "(?:.*/)?", i + 3
        elif pattern.startswith("**", i):
            rx, i = rx + ".*", i + 2
        else:
            j = i
            while j < len(pattern) and not pattern.startswith("**", j):
                j += 1
            rx += fnmatch.translate(pattern[i:j])[4:-3].replace(".*", "[^/]*")
            i = j
    return re.fullmatch(rx, url) is not None


def cache_key(url: str) -> str:
    """A short stable directory name for ``url`` (the default local cache of a remote source)."""
    return hashlib.sha256(url.rstrip("/").encode("utf-8", "surrogateescape")).hexdigest()[:16]


def parse_size(value) -> int | None:
    """Bytes from Mosaic's ``cache_limit`` notation: an int, or a string such as ``"10gb"``, ``"512MiB"``,
    ``"1.5t"`` (powers of 1000 for ``kb``..., of 1024 for ``kib``...). None stays None.

    Raises ValueError for anything else or a value < 1.
    """
    if value is None:
        return None
    if isinstance(value, bool):
        raise ValueError(f"cache_limit must be bytes (an int or a string like '10gb'), got {value!r}")
    if isinstance(value, (int, float)):
        n = int(value)
    else:
        m = _SIZE.match(str(value))
        if not m:
            raise ValueError(f"cache_limit={value!r}: expected bytes as an int or a string like '10gb' or '512mib'")
        base = 1024 if m.group(3).lower().startswith("i") else 1000
        n = int(float(m.group(1)) * base ** " kmgtp".index(m.group(2).lower() or " "))
    if n < 1:
        raise ValueError(f"cache_limit must be at least 1 byte, got {value!r}")
    return n
