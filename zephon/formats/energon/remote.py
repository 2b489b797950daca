"""Energon-prepared datasets at an object-storage URL (``s3://``, ``msc://``): metadata cached, tars read by range.

Opening lists the prefix once (every object's size), fetches ``.nv-meta/`` (``.info.json`` / ``.info.yaml``,
the split and dataset configs, ``index.sqlite`` when present) into the local cache, and reads it there with
the local code. A shard's ``.tar.idx`` is fetched on its first read. A tar of at most ``WHOLE_TAR`` bytes is
fetched whole into the cache (one GET instead of one per run of neighbouring samples: at 30 ms a request,
per-sample GETs cap a stream at ~33 samples/s), and read ahead in the core's order (``prefetch``); a larger
one is read by byte range from the tar itself (one ranged GET per run of neighbouring samples).
"""
from __future__ import annotations

from ..errors import DataError
from ..remote import RemoteRoot, relative
from ..remote.readahead import DEFAULT_CHUNKS, ReadAhead, has_room
from .nvmeta import INDEX_SQLITE, INFO_JSON, INFO_YAML, MAIN_FOLDER
from .tar_index import itar_path


WHOLE_TAR = 256 << 20   # bytes: tars up to this size are cached whole


class RemoteTars:
    """Where a ``PreparedWebdataset`` at a URL reads from: its ``RemoteRoot`` and ``sizes`` (path below the root
    -> bytes, from one listing); ``read_ahead`` / ``read_ahead_chunks``: the ``ReadAhead`` settings. Picklable."""

    def __init__(self, root: RemoteRoot, sizes: dict[str, int], read_ahead: int = 4,
                 read_ahead_chunks: int = DEFAULT_CHUNKS):
        self.root, self.sizes = root, sizes
        self.ahead = ReadAhead(read_ahead, read_ahead_chunks)

    def whole(self, name: str) -> bool:
        """Whether tar ``name`` is cached whole: at most ``WHOLE_TAR`` bytes and a quarter of ``cache_limit``."""
        size, limit = self.sizes[name], self.root.cache.limit
        return size <= WHOLE_TAR and (limit is None or 4 * size <= limit)

    def prefetch(self, names) -> None:
        """Fetch the small tars ``names`` (in the order they will be read) and their indexes in the background."""
        for n in names:
            if self.whole(n):
                self.ahead.submit(n, lambda n=n: self._ahead_one(n))

    def _ahead_one(self, name: str) -> None:
        self.tar_index(name)
        if not self.root.fresh(name, self.root.identity(name, self.sizes[name])) and \
                has_room(self.root.cache, self.sizes[name]):
            self.root.ensure(name, self.sizes[name])

    def size(self, name: str) -> int | None:
        """Bytes of object ``name`` (relative to the root), or None when it is not there."""
        return self.sizes.get(name)

    def tar_index(self, name: str) -> str:
        """Local path of the ``.tar.idx`` of tar ``name`` (fetched into the cache once)."""
        return self.root.metadata(itar_path(name), refresh=False)

    def pread(self, name: str):
        """A ``pread`` view of tar ``name``: its cached copy when ``whole``, else ranged GETs."""
        if self.whole(name):
            return self.root.cached(name, self.sizes[name])
        return self.root.ranges(name, self.sizes[name])


def open_remote_root(url: str, *, local, cache_dir, download_retry, download_timeout, cache_limit,
                     split_config: str, dataset_config: str, read_ahead: int = 4,
                     read_ahead_chunks: int = DEFAULT_CHUNKS) -> RemoteTars:
    """List the dataset at ``url`` and fetch its ``.nv-meta/`` files into the cache (``RemoteTars.root.local``
    then holds them where the local reader looks). Raises DataError when there is no ``.nv-meta/`` there,
    RemoteError naming the URL when the store cannot be read."""
    root = RemoteRoot(url, local=local, download_retry=download_retry, download_timeout=download_timeout,
                      cache_limit=cache_limit, cache_dir=cache_dir)
    sizes = {relative(o.url, root.url): o.size for o in root.list()}
    meta = [k for k in sizes if k.startswith(MAIN_FOLDER + "/")]
    if not meta:
        raise DataError(f"not an Energon-prepared dataset: no {MAIN_FOLDER}/ objects under this URL; run `energon "
                        f"prepare` on the dataset and upload {MAIN_FOLDER}/ with the tars", path=root.url)
    wanted = {INFO_JSON, INFO_YAML, split_config, "split.json", "split.yaml", dataset_config, INDEX_SQLITE}
    for k in meta:
        if k.split("/", 1)[1] in wanted:
            root.metadata(k)
    return RemoteTars(root, sizes, read_ahead, read_ahead_chunks)
