"""Opening one split part of an Energon-prepared WebDataset root: ``open_energon`` -> ``PreparedWebdataset``.

One shard per tar of the split (in split.yaml order; a shard listed twice appears twice), each with the
samples of the tar minus the excluded keys, optionally restricted to a metadataset ``subset``. Samples are
read by ``reader.TarShardReader`` (record layout in its module docstring). Bad input raises DataError
naming file, shard, sample and key; with ``on_error="skip"`` a bad sample reads as ``{"__error__": message}``
(a broken shard gives that for each sample); errors in ``.nv-meta`` always raise at open time.
"""
from __future__ import annotations

import os

import numpy as np

from ..base import BrokenShard, Dataset, ShardInfo
from ..errors import DataError
from ..fileio import PreadFile
from ..remote import is_remote, local_path
from ..remote.readahead import DEFAULT_CHUNKS
from . import wds
from .fields import split_field_access
from .nvmeta import read_dataset_config, read_info, read_split, resolve_part_filter
from .reader import ShardMeta, TarShardReader
from .remote import open_remote_root
from .subset import as_subset, subset_bounds
from .tar_index import itar_path, list_keys, read_tar_index

FORMAT = "energon"


class PreparedWebdataset(Dataset):
    """A ``Dataset`` over one split part of an Energon-prepared WebDataset (see the module docstring).

    Attributes: ``root`` (absolute dataset root), ``split_part``, ``metas`` (per shard: name, raw count,
    restore offset, kept raw indices), ``energon`` (from dataset.yaml: ``sample_type``, ``field_map``,
    ``subflavors``, ``part_filter``, ``crude``, ...), ``decode``, ``image_decode``, ``allow_unsafe_types``.
    ``shards[i]`` is a ``ShardInfo`` (tar path, samples after excludes, format "energon", tar size/mtime).
    Picklable: readers are reopened lazily.
    """

    def __init__(self, name, shards, metas, *, root, split_part, energon, on_error="raise", decode=True,
                 image_decode=wds.DEFAULT_IMAGE_DECODE, allow_unsafe_types=False, part_filter=None,
                 n_excluded=0, remote=None):
        super().__init__(name, shards, on_error=on_error)
        self.remote = remote  # energon.remote.RemoteTars at a URL (root: the local copy of .nv-meta), else None
        self.metas: tuple[ShardMeta, ...] = tuple(metas)
        self.root, self.split_part, self.energon = root, split_part, energon
        self.decode, self.image_decode, self.allow_unsafe_types = decode, image_decode, allow_unsafe_types
        self.part_filter = part_filter  # None | frozenset of part names
        self.n_excluded = n_excluded
        self.subset = None  # set by with_subset
        fm = energon.get("field_map")
        # field_map paths such as json[caption] need decoded parts: with decode=False the caller maps them.
        self._fields = ({k: (v, split_field_access(v)) for k, v in fm.items()} if fm and decode else None)

    def __repr__(self):
        return (f"PreparedWebdataset(name={self.name!r}, split_part={self.split_part!r}, shards={len(self.shards)}, "
                f"num_samples={self.num_samples}, excluded={self.n_excluded}, on_error={self.on_error!r})")

    def prefetch(self, shard_ids) -> None:
        """Remote: fetch these shards' small tars into the cache in the background (``RemoteTars.prefetch``)."""
        if self.remote is not None:
            self.remote.prefetch([self.metas[s].name for s in shard_ids])

    def _check_unchanged(self, shard_id: int, info: ShardInfo) -> None:
        if self.remote is None:  # a remote tar is read by range: its .tar.idx bounds every read
            super()._check_unchanged(shard_id, info)

    def tar_access(self, shard_id: int):
        """``(tar bytes, local .tar.idx path, pread)`` of shard ``shard_id`` (a URL's: ranged GETs)."""
        meta = self.metas[shard_id]
        if self.remote is not None:
            return self.shards[shard_id].size_bytes, self.remote.tar_index(meta.name), self.remote.pread(meta.name)
        return os.stat(meta.path).st_size, itar_path(meta.path), PreadFile(meta.path)

    def _make_reader(self, shard_id: int):  # base.Dataset hook: opened lazily, once per process
        def open_reader():
            try:
                return TarShardReader(self, shard_id)
            except OSError as e:
                raise DataError(f"cannot read: {e.strerror or e}", path=self.shards[shard_id].path,
                                shard=shard_id) from None

        return self._open_or_broken(shard_id, open_reader, ["__key__", "__parts__"])

    def fingerprint(self) -> dict:
        """What identifies this dataset's content in a checkpoint: ``{"name", "format": "energon", "split_part",
        "part_filter", "decode", "image_decode", "subset": [start, end) bounds | None,
        "shards": [[shard name, samples kept, raw samples, tar bytes, restore offset], ...]}``."""
        return {
            "name": self.name, "format": FORMAT, "split_part": self.split_part,
            "part_filter": sorted(self.part_filter) if self.part_filter is not None else None,
            "decode": self.decode, "image_decode": self.image_decode,
            "subset": list(self.subset["bounds"]) if self.subset else None,
            "shards": [[m.name, m.num_samples, m.raw_count, s.size_bytes, m.global_offset]
                       for m, s in zip(self.metas, self.shards)],
        }

    def sample_key(self, shard_id: int, index: int) -> str:
        """Key of sample ``index`` of shard ``shard_id`` without reading its data."""
        r = self._reader(shard_id)
        if isinstance(r, BrokenShard):
            raise r.error
        return r.keys[self.metas[shard_id].raw_index(index)]

    def with_subset(self, subset) -> "PreparedWebdataset":
        """This split restricted to a metadataset leaf's ``subset``, as Energon's sharder applies it.

        subset: None (returns ``self``), a merged subset as ``load_metadataset`` gives per leaf, or a YAML
        entry ``{"range": [start, end]}`` (see ``subset.as_subset``). ``subset_bounds(subset, total)`` selects
        ``[start, end)`` over the split's restore indices (``total`` counts excluded samples too), then
        excluded samples are dropped. Shards left with no samples are dropped (shard ids renumber;
        ``__restore_key__`` stays Energon's). The result's ``subset`` is ``{"bounds": (start, end), "range",
        "absolute_range"}`` and enters ``fingerprint()``.
        Raises DataError naming the root and split when the range does not fit the split or selects no
        sample; ValueError for a malformed subset or one applied to a dataset that already is a subset.
        """
        subset = as_subset(subset)
        if subset is None:
            return self
        if self.subset is not None:
            # The split's total is gone once shards were dropped; nested ranges are merged by load_metadataset.
            raise ValueError(f"{self.name} is already the subset {self.subset['bounds']}; merge the ranges first")
        total = sum(m.raw_count for m in self.metas)
        try:
            start, end = subset_bounds(subset, total)
        except ValueError as e:
            raise DataError(f"split part {self.split_part!r}: {e}", path=self.root) from None
        metas, shards = [], []
        for m, s in zip(self.metas, self.shards):
            lo, hi = max(start - m.global_offset, 0), min(end - m.global_offset, m.raw_count)
            if lo >= hi:
                continue
            kept = np.arange(m.raw_count, dtype=np.int64) if m.kept is None else m.kept
            kept = kept[(kept >= lo) & (kept < hi)]
            if not len(kept):
                continue
            nm = ShardMeta(m.name, m.path, m.raw_count, m.global_offset, m.info_pos,
                           None if len(kept) == m.raw_count else kept)
            metas.append(nm)
            shards.append(ShardInfo(s.path, nm.num_samples, s.format, s.size_bytes, s.mtime_ns))
        if not metas:
            raise DataError(f"split part {self.split_part!r}: subset [{start}, {end}) of {total} samples leaves no "
                            f"samples (after excludes)", path=self.root)
        ds = PreparedWebdataset(self.name, shards, metas, root=self.root, split_part=self.split_part,
                                energon=self.energon, on_error=self.on_error, decode=self.decode,
                                image_decode=self.image_decode, allow_unsafe_types=self.allow_unsafe_types,
                                part_filter=self.part_filter, n_excluded=self.n_excluded, remote=self.remote)
        ds.subset = {"bounds": (start, end), **subset}
        return ds

    def raw_index(self, shard_id: int, index: int) -> int:
        """Index over the split's tars including excluded samples (Energon's restore index, the space
        Energon's ``subset`` ranges apply to) of sample ``index`` of shard ``shard_id``."""
        m = self.metas[shard_id]
        return m.global_offset + m.raw_index(index)


def open_energon(source, *, split_part: str = "train", name: str | None = None, on_error: str = "raise",
                 split_config: str = "split.yaml", dataset_config: str = "dataset.yaml", decode: bool | None = None,
                 image_decode: str | None = None, allow_unsafe_types: bool = False, part_filter="auto",
                 subset=None, columns=None, cache_dir=None, local: str | None = None, download_retry: int = 2,
                 download_timeout: float = 60.0, cache_limit=None, read_ahead: int = 4,
                 read_ahead_chunks: int = DEFAULT_CHUNKS) -> PreparedWebdataset:
    """Open split part ``split_part`` of an Energon-prepared WebDataset root.

    source: the dataset root (a directory holding ``.nv-meta/``). split_part: e.g. "train", "val".
    name: dataset name (default ``"<root dir name>/<split_part>"``). on_error: "raise" | "skip" (per sample).
    split_config / dataset_config: file names under ``.nv-meta/`` (Energon's defaults).
    decode: decode parts like Energon's default decoder (default True; False: raw bytes, like Energon with
    ``decoder=None``; dataset.yaml ``decoder: null`` also turns it off).
    image_decode: webdataset imagespec for images (default: dataset.yaml's ``decoder.image_decode``, else
    ``"torchrgb"``: float32 tensors ``(3, H, W)`` in [0, 1]).
    allow_unsafe_types: decode pickle parts and ``.pth`` with full ``torch.load`` (runs arbitrary code).
    part_filter: ``"auto"`` (Energon's: the parts a field_map uses, or the crude ``part_filter`` list; all
    parts otherwise), None (all parts) or a list of part names.
    subset: a metadataset leaf's subset (``load_metadataset(...)[i]["subset"]``) or a YAML entry
    ``{"range": ["10%", "60%"]}`` / ``{"range": [100, "end"]}``; see ``PreparedWebdataset.with_subset``.
    columns / cache_dir: accepted for ``open_dataset``'s signature; columns must be None.
    local, download_retry, download_timeout, cache_limit: for a root at an ``s3://`` / ``msc://`` URL
        (``energon.remote``, docs/remote.md): where ``.nv-meta/``, the ``.tar.idx`` files and tars up to
        ``energon.remote.WHOLE_TAR`` bytes are cached (larger tars are read by byte range), re-attempts and
        seconds per attempt of each request, cache bytes. read_ahead: downloads at once of the small tars the
        core will read next (0: off); read_ahead_chunks: how many chunks past its current one each lane hints
        (the horizon; default 16).

    Work at open time: reads .nv-meta, stats every tar and checks that its ``.tar.idx`` exists; for a
    shard with ``<shard>/<key>`` excludes, lists its keys (index.sqlite, else one header read per
    sample) to find them. Tar data is read on ``read`` only.

    Raises DataError (always, whatever on_error): no .nv-meta / info file (suggests ``energon prepare``),
    malformed YAML/JSON, unknown split part (naming the ones there), a split shard missing from
    .info.json or from disk, a tar without ``.tar.idx`` (suggests ``energon prepare``), a split with no
    shards left, a subset out of range or empty. ValueError for bad arguments.
    """
    _check_arguments(source, split_part, on_error, image_decode, columns)
    subset = as_subset(subset)  # a malformed subset fails before any file is read
    if isinstance(part_filter, str) and part_filter != "auto":
        part_filter = [part_filter]
    remote, source = None, local_path(source)
    if is_remote(source):
        remote = open_remote_root(os.fspath(source), local=local, cache_dir=cache_dir, download_retry=download_retry,
                                  download_timeout=download_timeout, cache_limit=cache_limit,
                                  split_config=split_config, dataset_config=dataset_config, read_ahead=read_ahead,
                                  read_ahead_chunks=read_ahead_chunks)
        root = remote.root.local
    else:
        root = os.path.abspath(os.fspath(source))
    if not os.path.isdir(root):  # a dataset is a directory; a metadataset (.yaml) or a .jsonl file is a file
        what = "not a directory (an Energon dataset is a prepared directory)" if os.path.exists(root) else \
            "no such file" if os.path.splitext(root)[1] else "no such directory"
        raise DataError(what, path=root)
    counts = read_info(root)
    parts, excludes, split_path = read_split(root, split_config)
    if split_part not in parts:
        raise DataError(f"no split part {split_part!r} (split parts here: {', '.join(sorted(parts)) or 'none'})",
                        path=split_path)
    energon = read_dataset_config(root, dataset_config)
    if decode is None:
        decode = energon["decode"]
    if image_decode is None:
        image_decode = energon["image_decode"] or wds.DEFAULT_IMAGE_DECODE
        if image_decode not in wds.IMAGE_SPECS:
            raise DataError(f"unknown decoder.image_decode {image_decode!r}", path=energon["path"])
    excl = set(excludes)
    names = [n for n in parts[split_part] if n not in excl]
    if not names:
        raise DataError(f"split part {split_part!r} has no shards (after exclude)", path=split_path)
    metas, shards = _split_shards(root, counts, names, {e for e in excl if "/" in e}, split_part, split_path,
                                  remote)
    if name is None:
        name = os.path.basename(remote.root.url if remote else root) + f"/{split_part}"
    ds = PreparedWebdataset(name, shards, metas, root=root, split_part=split_part, energon=energon,
                            on_error=on_error, decode=decode, image_decode=image_decode,
                            allow_unsafe_types=allow_unsafe_types,
                            part_filter=resolve_part_filter(energon, part_filter),
                            n_excluded=sum(m.raw_count - m.num_samples for m in metas), remote=remote)
    return ds.with_subset(subset)


def _check_arguments(source, split_part, on_error, image_decode, columns) -> None:
    """``open_energon``'s argument checks, done before any file is read (same names as there).

    Raises ValueError naming the bad argument.
    """
    if on_error not in ("raise", "skip"):
        raise ValueError(f"on_error must be 'raise' or 'skip', not {on_error!r}")
    if columns is not None:
        raise ValueError("columns do not apply to Energon datasets (samples are dicts of parts; use part_filter)")
    if isinstance(source, (list, tuple)):
        raise ValueError("an Energon dataset is one root directory; open several with several open_dataset calls")
    if not isinstance(split_part, str) or not split_part:
        raise ValueError(f"split_part must be a non-empty string, not {split_part!r}")
    if image_decode is not None and image_decode not in wds.IMAGE_SPECS:
        raise ValueError(f"image_decode must be one of {sorted(wds.IMAGE_SPECS)}, not {image_decode!r}")


def _remote_tar(remote, n: str, shard: int) -> tuple[str, int]:
    """``(URL, bytes)`` of tar ``n`` of a remote root; DataError when it or its ``.tar.idx`` is not there."""
    url = remote.root.url_of(n)
    if remote.size(n) is None:
        raise DataError("shard listed in .nv-meta missing: no such object", path=url, shard=shard)
    if remote.size(itar_path(n)) is None:
        raise DataError(f"no tar index {os.path.basename(itar_path(n))} next to the tar: run `energon prepare` on "
                        f"the dataset and upload the .tar.idx files", path=url, shard=shard)
    return url, remote.size(n)


def _split_shards(root, counts, names, sample_excl, split_part, split_path,
                  remote=None) -> tuple[list[ShardMeta], list[ShardInfo]]:
    """``(metas, shard infos)`` of the split's tars ``names``, with ``<shard>/<key>`` excludes applied.

    counts: ``read_info``. sample_excl: the exclude entries naming one sample. split_part / split_path:
    named in errors. remote: ``RemoteTars`` of a root at a URL (tars named by URL, sized by its listing).
    Raises DataError for a shard unknown to .info.json, missing, or without ``.tar.idx``.
    """
    info_pos = {n: i for i, n in enumerate(counts)}
    metas, shards = [], []
    offset = 0
    for n in names:
        if n not in counts:
            raise DataError(f"split part {split_part!r} lists shard {n!r}, which .info.json does not know "
                            f"(re-run `energon prepare`)", path=split_path)
        if remote is not None:
            path, size = _remote_tar(remote, n, len(metas))
            meta = ShardMeta(n, path, counts[n], offset, info_pos[n])
            offset += counts[n]
            wanted = {e[len(n) + 1:] for e in sample_excl if e.startswith(n + "/")}
            if wanted and meta.raw_count:
                off = read_tar_index(remote.tar_index(n), size, meta.raw_count, tar_path=path, shard=len(metas))
                keys, _ = list_keys(root, meta.info_pos, off, remote.pread(n), tar_path=path, shard=len(metas))
                _exclude(meta, keys, wanted)
            metas.append(meta)
            shards.append(ShardInfo(path, meta.num_samples, FORMAT, size, 0))
            continue
        path = os.path.join(root, n)
        try:
            st = os.stat(path)
        except OSError as e:
            raise DataError(f"shard listed in .nv-meta missing: {e.strerror or e}", path=path,
                            shard=len(metas)) from None  # a shard of the data: zephon inspect says bad data
        if not os.path.isfile(itar_path(path)):
            raise DataError(f"no tar index {os.path.basename(itar_path(path))} next to the tar: run "
                            f"`energon prepare {root}` (megatron-energon) to index the shards", path=path,
                            shard=len(metas))
        meta = ShardMeta(n, path, counts[n], offset, info_pos[n])
        offset += counts[n]  # restore indices count excluded samples too, as Energon's do
        wanted = {e[len(n) + 1:] for e in sample_excl if e.startswith(n + "/")}
        if wanted and meta.raw_count:
            off = read_tar_index(itar_path(path), st.st_size, meta.raw_count, tar_path=path, shard=len(metas))
            pread = PreadFile(path)
            try:
                keys, _ = list_keys(root, meta.info_pos, off, pread, tar_path=path, shard=len(metas))
            finally:
                pread.close()
            _exclude(meta, keys, wanted)
        metas.append(meta)
        shards.append(ShardInfo(path, meta.num_samples, FORMAT, st.st_size, st.st_mtime_ns))
    return metas, shards


def _exclude(meta: ShardMeta, keys: list[str], wanted: set) -> None:
    """Drop the samples whose key is in ``wanted`` from ``meta.kept`` (a key not in the tar is ignored, as in
    Energon)."""
    drop = [i for i, k in enumerate(keys) if k in wanted]
    if drop:
        meta.kept = np.setdiff1d(np.arange(meta.raw_count, dtype=np.int64), np.asarray(drop, dtype=np.int64))
