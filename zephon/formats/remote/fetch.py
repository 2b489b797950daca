"""Requests with retries, exponential backoff and a deadline per attempt, and errors that name the object.

``Fetcher(retries, timeout)`` wraps a backend (``backends.backend_for``): every call is tried ``retries + 1``
times (Mosaic's ``download_retry`` counts re-attempts), sleeping ``BACKOFF * 2**k`` seconds (capped at
``MAX_BACKOFF``, with jitter) between tries; an attempt that has no complete answer within ``timeout`` seconds
(Mosaic's ``download_timeout``) is abandoned, so a server that stops answering costs at most about
``(retries + 1) x timeout`` plus the backoff, never a hang. A missing object or refused credentials are not
retried. After the last try ``RemoteError`` names the URL, the tries and the last cause; ``ObjectMissing`` and
``AccessDenied`` also name the credentials source (without secrets).
"""
from __future__ import annotations

import os
import random
import threading
import time
from typing import BinaryIO, Callable

from .backends import Denied, Expired, Missing, ObjectInfo, backend_for
from .errors import AccessDenied, ObjectMissing, RemoteError, RemoteTimeout, RemoteUnreachable
from .urls import scheme_of

BACKOFF = 0.25       # seconds before the first re-attempt
MAX_BACKOFF = 8.0    # seconds at most between attempts

STATS = {"downloads": 0, "downloaded_bytes": 0, "range_reads": 0, "range_bytes": 0, "retries": 0,
         "cache_hits": 0, "cache_misses": 0}
_stats_lock = threading.Lock()
_reported = dict(STATS)  # the counts ``unreported`` has handed out in this process
_backends: dict = {}
_backends_lock = threading.Lock()


def count(**deltas) -> None:
    """Add ``deltas`` to this process's ``STATS`` (what tests and the benchmark read)."""
    with _stats_lock:
        for k, v in deltas.items():
            STATS[k] += v


def stats() -> dict:
    """A copy of this process's counters: downloads, downloaded_bytes, range_reads, range_bytes, retries,
    cache_hits and cache_misses (a cached shard found fresh, or downloaded: ``RemoteRoot.ensure``)."""
    with _stats_lock:
        return dict(STATS)


def unreported() -> dict:
    """The counts added in this process since the last call (each count is handed out once): how a worker
    process of the processes runner reports its downloads to the loader, with each unit's result."""
    with _stats_lock:
        out = {k: v - _reported[k] for k, v in STATS.items() if v != _reported[k]}
        _reported.update(STATS)
        return out


def _forked() -> None:
    """A forked child reports only its own counts, and starts with a free lock (the parent's may be held)."""
    global _stats_lock
    _stats_lock = threading.Lock()
    _reported.update(STATS)


os.register_at_fork(after_in_child=_forked)


_ENV_KEYS = ("S3_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL", "AWS_PROFILE", "AWS_ACCESS_KEY_ID",
             "MSC_CONFIG")


def _backend(scheme: str, timeout: float):
    # one client per process (clients are not fork-safe), timeout, and endpoint / credentials settings
    key = (os.getpid(), scheme, timeout, tuple(os.environ.get(k) for k in _ENV_KEYS))
    with _backends_lock:
        b = _backends.get(key)
        if b is None:
            b = _backends[key] = backend_for(scheme, timeout)
        return b


class Fetcher:
    """Retried, time-bounded requests to the store of one URL scheme. Picklable (holds options only).

    retries: re-attempts after the first (>= 0). timeout: seconds one attempt may take (> 0).
    """

    def __init__(self, retries: int = 2, timeout: float = 60.0):
        if isinstance(retries, bool) or not isinstance(retries, int) or retries < 0:
            raise ValueError(f"download_retry must be an int >= 0, got {retries!r}")
        if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not timeout > 0:
            raise ValueError(f"download_timeout must be a number of seconds > 0, got {timeout!r}")
        self.retries, self.timeout = retries, float(timeout)

    def __repr__(self):
        return f"Fetcher(retries={self.retries}, timeout={self.timeout})"

    def backend(self, url: str):
        """The backend for ``url``'s scheme (this process's)."""
        return _backend(scheme_of(url), self.timeout)

    def run(self, url: str, what: str, attempt: Callable[[object, float], object]):
        """``attempt(backend, deadline)`` until it succeeds or the tries run out.

        url: the object (named in errors). what: the operation, e.g. "download" (in errors).
        Raises ObjectMissing / AccessDenied at once, RemoteTimeout or RemoteUnreachable after the last try.
        """
        backend = self.backend(url)
        last, timeouts = None, 0
        tries = self.retries + 1
        for k in range(tries):
            if k:
                count(retries=1)
                pause = min(MAX_BACKOFF, BACKOFF * 2 ** (k - 1))
                time.sleep(pause * random.uniform(0.5, 1.0))
            try:
                return attempt(backend, time.monotonic() + self.timeout)
            except Missing as e:
                raise ObjectMissing(url, f"{what} failed: object not found ({e}); credentials: "
                                         f"{backend.credentials()}") from None
            except Denied as e:
                raise AccessDenied(url, f"{what} failed: access denied ({e}); credentials: "
                                        f"{backend.credentials()}") from None
            except ImportError:
                raise
            except (ValueError, TypeError) as e:  # a bad request or an object larger than expected: not retried
                raise RemoteError(url, f"{what} failed: {type(e).__name__}: {e}", k + 1) from None
            except Exception as e:  # network, server and timeout errors of any client library: retried
                last = e
                timeouts += isinstance(e, Expired) or "timeout" in type(e).__name__.lower()
        cause = f"{type(last).__name__}: {last}"
        words = (f"{what} failed after {tries} attempt(s) (download_retry={self.retries}, "
                 f"download_timeout={self.timeout:g}s); last cause: {cause}")
        if timeouts == tries:
            raise RemoteTimeout(url, words, tries) from None
        raise RemoteUnreachable(url, words, tries) from None

    def head(self, url: str) -> ObjectInfo:
        """Size and ETag of object ``url``."""
        return self.run(url, "HEAD", lambda b, d: b.head(url))

    def exists(self, url: str) -> bool:
        """Whether object ``url`` exists (False when missing; other failures raise)."""
        try:
            self.head(url)
            return True
        except ObjectMissing:
            return False

    def get(self, url: str, start: int, end: int) -> bytes:
        """Bytes ``[start, end)`` of object ``url`` (one ranged GET per attempt)."""
        data = self.run(url, f"range read of bytes [{start}, {end})", lambda b, d: b.get(url, start, end, d))
        count(range_reads=1, range_bytes=len(data))
        return data

    def read_all(self, url: str) -> bytes:
        """The whole of object ``url`` in memory (small metadata files)."""
        return self.read_object(url)[0]

    def read_object(self, url: str) -> tuple[bytes, str]:
        """``(bytes, ETag)`` of the whole object ``url`` (ETag "" when the store gives none)."""
        import io

        def attempt(b, d):
            buf = io.BytesIO()
            etag = b.stream(url, buf, d).etag
            return buf.getvalue(), etag
        data, etag = self.run(url, "download", attempt)
        count(downloads=1, downloaded_bytes=len(data))
        return data, etag

    def download(self, url: str, out: BinaryIO, size: int | None = None) -> ObjectInfo:
        """Object ``url`` into the seekable file ``out`` (rewound for each attempt); returns its size and the
        ETag of what was read.

        size: the size expected (from an index or HEAD): more bytes fail the attempt, fewer raise RemoteError.
        """
        def attempt(b, d):
            out.seek(0)
            return b.stream(url, out, d, size)
        got = self.run(url, "download", attempt)
        if size is not None and got.size != size:
            raise RemoteError(url, f"download returned {got.size} bytes, {size} expected (object changed or "
                                   f"truncated)")
        count(downloads=1, downloaded_bytes=got.size)
        return got

    def list(self, url: str) -> list[ObjectInfo]:
        """Objects below the prefix ``url`` (all depths), sorted by URL."""
        return self.run(url, "list", lambda b, d: b.list(url))


def detection_fetcher(keywords: dict) -> Fetcher:
    """The ``Fetcher`` of an open's ``download_retry`` / ``download_timeout`` keywords (absent or None: 2, 60 s)."""
    retries, timeout = keywords.get("download_retry"), keywords.get("download_timeout")
    return Fetcher(2 if retries is None else retries, 60.0 if timeout is None else timeout)


def probe(url: str, fetcher: Fetcher | None = None) -> bool:
    """Whether object ``url`` exists, for format detection: a HEAD with the dataset's own bound.

    fetcher: the dataset's ``Fetcher`` (its download_retry / download_timeout); None: the defaults (2, 60 s).
    False when the object is missing or the credentials are refused (the open that follows names the
    cause); raises RemoteTimeout / RemoteError naming the URL when the store does not answer, so detection
    costs at most one request's bound, never one per format probed.
    """
    try:
        (fetcher or Fetcher()).run(url, "HEAD (format detection)", lambda b, d: b.head(url))
        return True
    except (ObjectMissing, AccessDenied):
        return False
