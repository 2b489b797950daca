"""Random access to the samples of one tar shard of an Energon split: ``ShardMeta`` and ``TarShardReader``.

A read turns sample indices (after excludes) into raw tar indices, reads the byte spans of runs of
neighbouring samples with one ``pread`` each (``.tar.idx`` offsets), parses the members, checks the key
against the index, decodes the parts (``wds.decode_part``) and maps ``field_map`` fields. A record::

    {"__key__": "s0001",                          # sample key (str)
     "__restore_key__": ["Webdataset", 7],        # Energon's restore index: the sample's index over the
                                                  # split's tars *including* excluded samples
     "__shard__": "data-001.tar",                 # shard name as in .info.json (relative to the root)
     "__shard_idx__": 1, "__sample_idx__": 2,     # the (shard, index) that was read
     "__parts__": {"txt": "a caption", "png": tensor(3, H, W)},   # decoded parts (part filter applied)
     "__fields__": {"caption": ..., "image": ...}}                # with a field_map and decode=True
"""
from __future__ import annotations

from typing import Any, Sequence

from ..errors import DataError, per_sample
from ..fileio import coalesce_runs, pread_spans
from . import wds
from .fields import field_access
from .tar_index import list_keys, parse_sample, read_tar_index


class ShardMeta:
    """Static description of one split shard (what a worker needs to reopen it; no file handles).

    name: shard name relative to the root, as in .info.json. path: the tar. raw_count: its samples in
    .info.json. global_offset: restore index of its first sample over the split. info_pos: its position
    in .info.json (index.sqlite's ``tar_file_id``). kept: int64 array of the raw indices read, ascending
    (None = all; excludes and subsets leave fewer).
    """

    __slots__ = ("name", "path", "raw_count", "global_offset", "info_pos", "kept")

    def __init__(self, name, path, raw_count, global_offset, info_pos, kept=None):
        self.name, self.path, self.raw_count = name, path, raw_count
        self.global_offset, self.info_pos, self.kept = global_offset, info_pos, kept

    @property
    def num_samples(self) -> int:
        """Samples read from this tar (after excludes / subset)."""
        return self.raw_count if self.kept is None else len(self.kept)

    def raw_index(self, i: int) -> int:
        """Raw tar index of sample ``i`` (an index after excludes / subset)."""
        return i if self.kept is None else int(self.kept[i])

    # __slots__ without __dict__: spell out the state so datasets can be sent to process-runner workers.
    def __getstate__(self):
        return {k: getattr(self, k) for k in self.__slots__}

    def __setstate__(self, st):
        for k, v in st.items():
            setattr(self, k, v)


class TarShardReader:
    """Random access to the samples of one tar (one split shard). Thread-safe (pread only).

    ds: the ``PreparedWebdataset`` (its metas, part filter, field map and decode settings). shard_id: the shard.
    Raises DataError when the ``.tar.idx`` is missing or does not match, or a key cannot be read; OSError
    when the tar cannot be opened.
    """

    def __init__(self, ds, shard_id: int):
        meta = ds.metas[shard_id]
        self.meta, self.shard_id = meta, shard_id
        self.part_filter = ds.part_filter
        self.fields = ds._fields
        self.decode, self.image_decode, self.allow_unsafe = ds.decode, ds.image_decode, ds.allow_unsafe_types
        size, idx_path, pread = ds.tar_access(shard_id)
        self.off = read_tar_index(idx_path, size, meta.raw_count, tar_path=meta.path, shard=shard_id)
        self.pread = pread
        self.keys, _ = list_keys(ds.root, meta.info_pos, self.off, self.pread, tar_path=meta.path, shard=shard_id)
        first: dict[str, int] = {}
        self.dups: dict[str, list[int]] = {}
        for i, k in enumerate(self.keys):
            j = first.setdefault(k, i)
            if j != i:
                self.dups.setdefault(k, [j]).append(i)

    @property
    def num_samples(self) -> int:
        """Samples of this shard (after excludes / subset)."""
        return self.meta.num_samples

    def first_keys(self) -> list[str]:
        """The record keys every sample has (what ``inspect_source`` lists as columns)."""
        return ["__key__", "__parts__"]

    def _err(self, msg, i, key=None) -> DataError:
        k = f"key {key!r}: " if key is not None else ""
        return DataError(k + msg, path=self.meta.path, shard=self.shard_id, sample=i)

    def read(self, indices: Sequence[int], on_error: str = "raise") -> list[dict]:
        """Records (see the module docstring) of samples ``indices`` (after excludes; repeats allowed), in
        that order. on_error: "raise" | "skip" (a bad sample becomes ``{"__error__": message}``).
        Raises DataError naming tar, shard, sample and key for a bad sample (with "raise")."""
        meta = self.meta
        raw_of = {i: meta.raw_index(i) for i in set(indices)}
        wanted = sorted(set(raw_of.values()))
        decoded: dict[int, Any] = {}
        runs = list(coalesce_runs(wanted, self.off))
        spans = [(int(self.off[a]), int(self.off[b + 1])) for a, b in runs]
        for (a, b), (lo, _), buf in zip(runs, spans, pread_spans(self.pread, spans)):  # one pin for all runs
            for r in range(a, b + 1):  # runs hold wanted ids only
                s, e = int(self.off[r]) - lo, int(self.off[r + 1]) - lo
                decoded[r] = (buf[s:e], len(buf) >= e)
        by_raw: dict[int, Any] = {}  # a repeated index is parsed and decoded once

        def read_one(i):
            r = raw_of[i]
            if r not in by_raw:
                by_raw[r] = self._sample(i, r, *decoded[r])
            res = by_raw[r]
            if isinstance(res, DataError):
                raise res
            d = dict(res)
            d["__sample_idx__"] = i
            d["__parts__"] = dict(res["__parts__"])
            return d
        return per_sample(indices, read_one, on_error)

    def _sample(self, i: int, r: int, span: bytes, complete: bool):
        """Record of sample ``i`` (raw index ``r``) from its bytes, or the DataError describing why not
        (returned, not raised, so a repeated index reports the same error without re-reading)."""
        meta = self.meta
        expect = self.keys[r]
        if expect in self.dups:
            return self._err(f"duplicate sample key in this shard (tar samples {self.dups[expect]}); keys must be "
                             f"unique (`energon prepare --fix-duplicates` renames them)", i, expect)
        if not complete:
            return self._err(f"tar truncated: sample bytes [{int(self.off[r])}, {int(self.off[r + 1])}) not all "
                             f"readable", i, expect)
        try:
            key, raw_parts, _names = parse_sample(span, parts_wanted=self.part_filter)
        except ValueError as e:
            return self._err(f"tar sample {r} at byte {int(self.off[r])}: {e}", i, expect)
        if key != expect:
            return self._err(f"tar sample {r} at byte {int(self.off[r])} has key {key!r}, but the index lists "
                             f"{expect!r}: the .tar.idx / index.sqlite do not match the tar; re-run `energon prepare`",
                             i, expect)
        parts = {}
        for p, data in raw_parts.items():
            if not self.decode:
                parts[p] = data
                continue
            try:
                parts[p] = wds.decode_part(p, data, image_decode=self.image_decode,
                                           allow_unsafe_types=self.allow_unsafe)
            except Exception as e:  # any decoder failure is bad data for this sample
                return self._err(f"part {p!r} does not decode: {type(e).__name__}: {e}", i, key)
        rec = {"__key__": key, "__restore_key__": ["Webdataset", meta.global_offset + r], "__shard__": meta.name,
               "__shard_idx__": self.shard_id, "__sample_idx__": i, "__parts__": parts}
        if self.fields is not None:
            view = {**parts, "__key__": key, "__shard__": meta.name,
                    "__restore_key__": ("Webdataset", meta.global_offset + r)}
            fields = {}
            for name, (spec, options) in self.fields.items():
                try:
                    fields[name] = field_access(view, options)
                except (KeyError, ValueError, IndexError, TypeError) as e:
                    missing = [o[0] for o in options if o[0] not in view]
                    why = (f"part {'/'.join(map(repr, missing))} missing" if len(missing) == len(options)
                           else f"cannot access it ({type(e).__name__}: {e})")
                    return self._err(f"field_map field {name!r} = {spec!r}: {why} (sample has parts: "
                                     f"{', '.join(sorted(parts)) or 'none'})", i, key)
            rec["__fields__"] = fields
        return rec

    def close(self):
        """Release the tar's file descriptor (a later read reopens it)."""
        self.pread.close()
