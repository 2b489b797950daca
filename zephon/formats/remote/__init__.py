"""Object storage (``s3://``, ``msc://``, ``gs://``) read through a local cache, for every format.

One module per job: ``urls`` (which sources are remote, joining and matching keys, ``cache_limit`` sizes),
``credentials`` (endpoint and credentials as users set them, named in errors without secrets), ``backends``
(boto3 for S3, the Multi-Storage Client, fsspec), ``fetch`` (retries, backoff, per-attempt deadline, errors
naming the object URL), ``cache`` (locks, atomic publication, LRU eviction under ``cache_limit`` that never
removes a shard being read), ``manifest`` (what each cached file is: URL, ETag, size, hashes), ``files``
(``pread`` views: cached copy, byte ranges, a seekable range file) and ``root`` (``RemoteRoot``: a remote
prefix and its cache, what the format readers use). The user guide is docs/remote.md.
"""
from .backends import ObjectInfo
from .cache import CacheFull, LocalCache, evictable, pinned
from .errors import AccessDenied, ObjectMissing, RemoteError, RemoteTimeout, RemoteUnreachable
from .fetch import Fetcher, detection_fetcher, probe, stats
from .manifest import CacheConflict, ObjectChanged
from .files import CachedFile, RangeFile, RangePread
from .root import RemoteRoot, check_digest, default_local, hashing_writer
from .urls import (FSSPEC_SCHEMES, SCHEMES, basename, cache_key, glob_match, glob_prefix, has_magic, is_remote, join,
                   local_path, parse_size, relative, split_url)

REMOTE_KEYWORDS = ("local", "download_retry", "download_timeout", "cache_limit")

__all__ = ["AccessDenied", "CacheConflict", "CacheFull", "CachedFile", "FSSPEC_SCHEMES", "Fetcher", "LocalCache",
           "ObjectChanged", "ObjectInfo", "ObjectMissing", "REMOTE_KEYWORDS", "RangeFile", "RangePread", "RemoteError",
           "RemoteRoot", "RemoteTimeout", "RemoteUnreachable", "SCHEMES", "basename", "cache_key", "check_digest",
           "default_local", "detection_fetcher", "evictable", "glob_match", "glob_prefix", "has_magic",
           "hashing_writer", "is_remote", "join", "local_path", "parse_size", "pinned", "probe", "relative",
           "split_url", "stats"]
