"""Energon-prepared datasets at an object-storage URL (``s3://``, ``msc://``): metadata cached, tars read by range.

Opening lists the prefix once (every object's size), fetches ``.nv-meta/`` (``.info.json`` / ``.info.yaml``,
the split and dataset configs, ``index.sqlite`` when present) into the local cache, and reads it there with
the local code. A shard's ``.tar.idx`` is fetched on its first read; its samples are then read by byte range
from the tar itself (one ranged GET per run of neighbouring samples): no tar is downloaded whole.
"""
from __future__ import annotations

from ..errors import DataError
from ..remote import RemoteRoot, relative
from .nvmeta import INDEX_SQLITE, INFO_JSON, INFO_YAML, MAIN_FOLDER
from .tar_index import itar_path


class RemoteTars:
    """Where an ``EnergonDataset`` at a URL reads from: its ``RemoteRoot`` and ``sizes`` (path below the root
    -> bytes, from one listing). Picklable."""

    def __init__(self, root: RemoteRoot, sizes: dict[str, int]):
        self.root, self.sizes = root, sizes

    def size(self, name: str) -> int | None:
        """Bytes of object ``name`` (relative to the root), or None when it is not there."""
        return self.sizes.get(name)

    def tar_index(self, name: str) -> str:
        """Local path of the ``.tar.idx`` of tar ``name`` (fetched into the cache once)."""
        return self.root.metadata(itar_path(name), refresh=False)

    def pread(self, name: str):
        """A ``pread`` view of tar ``name`` through ranged GETs."""
        return self.root.ranges(name, self.sizes[name])


def open_remote_root(url: str, *, local, cache_dir, download_retry, download_timeout, cache_limit,
                     split_config: str, dataset_config: str) -> RemoteTars:
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
    return RemoteTars(root, sizes)
