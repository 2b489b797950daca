"""Errors of the remote layer: an object that cannot be fetched, named by its URL, with the last cause.

They are not ``DataError``: a network failure or a refused credential is not bad data, so it is never turned
into a skipped sample by ``on_error="skip"``; it stops the run with the object named. Bad data that came over
the network (a hash mismatch, a corrupt stream) still raises ``DataError`` naming the shard.
"""
from __future__ import annotations


class RemoteError(RuntimeError):
    """An object of a remote source could not be fetched after the retries.

    url: the object URL. reason: what went wrong, with the last cause. attempts: tries made.
    ``str()`` is ``"<url>: <reason>"``.
    """

    def __init__(self, url: str, reason: str, attempts: int = 1):
        self.url, self.reason, self.attempts = url, reason, attempts
        super().__init__(f"{url}: {reason}")

    def __reduce__(self):
        # Keyword state is lost by default exception pickling; errors cross process-runner boundaries.
        return (type(self), (self.url, self.reason, self.attempts))


class ObjectMissing(RemoteError):
    """The object does not exist (404 / NoSuchKey / NoSuchBucket): not retried."""


class AccessDenied(RemoteError):
    """The server refused the credentials (401 / 403): not retried; the message names the credentials source."""


class RemoteUnreachable(RemoteError):
    """Every attempt failed in the network or the server (connection, 5xx, timeout): the object could not be
    read, which says nothing about its bytes (``zephon inspect`` reports it unreachable, not bad)."""


class RemoteTimeout(RemoteUnreachable):
    """Every attempt ran past ``download_timeout`` (a server that stops answering)."""
