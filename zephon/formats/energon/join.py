"""Joined Energon datasets (a Metadataset v2 ``join``): samples of several prepared datasets matched by key.

The first dataset is the primary: its split, excludes and order define the joined samples. Every other
dataset contributes the sample with the same ``__key__`` (after its own excludes), or, when it has none,
what its ``nonmatch`` says, as Energon's join index does: ``"error"`` (the default) refuses the join naming
the key and dataset, ``"skip"`` drops the primary sample, ``"none"`` joins ``None``. A secondary with a key
twice is refused (Energon refuses it too). Keys come from ``index.sqlite`` (or the tar headers); no sample
data is read to build the join. See docs/energon.md (join).
"""
from __future__ import annotations

import numpy as np

from ..base import Dataset, ShardInfo
from ..errors import DataError
from ..records import JOIN

NONMATCH = ("error", "skip", "none")


def _key_map(ds) -> dict:
    """``{key: (shard, index)}`` of a prepared dataset. Raises DataError for a key found twice."""
    out = {}
    for s, n in enumerate(ds.shard_sizes):
        for i in range(n):
            k = ds.sample_key(s, i)
            if k in out:
                raise DataError(f"cannot join: sample key {k!r} appears twice (shards {out[k][0]} and {s})",
                                path=ds.root)
            out[k] = (s, i)
    return out


class JoinedWebdataset(Dataset):
    """The primary's samples, each with its matches: a ``Dataset`` whose shards are the primary's shards
    (samples dropped by ``nonmatch="skip"`` removed).

    Args:
        members: the joined ``PreparedWebdataset``s, primary first.
        nonmatch: one of ``NONMATCH`` per member (the primary's must be ``"error"``, as in Energon).
        name: the dataset's name.
    A record is the primary's record plus ``JOIN``: ``[primary record, member record or None, ...]``.
    Raises DataError (naming the dataset root and the key) for a missing match under ``"error"`` or a
    duplicate key; ValueError for a bad ``nonmatch``."""

    def __init__(self, members, nonmatch, *, name: str):
        members, nonmatch = list(members), list(nonmatch)
        if len(members) < 2 or len(nonmatch) != len(members):
            raise ValueError(f"a join needs at least two datasets and one nonmatch each, got {len(members)} and "
                             f"{len(nonmatch)}")
        for m in nonmatch:
            if m not in NONMATCH:
                raise ValueError(f"join nonmatch must be one of {NONMATCH}, got {m!r}")
        if nonmatch[0] != "error":
            raise ValueError(f"the primary (first) dataset of a join must have nonmatch 'error', got {nonmatch[0]!r}")
        primary = members[0]
        maps = [_key_map(m) for m in members[1:]]
        rows, shards = [], []
        for s, info in enumerate(primary.shards):
            kept, matched = [], []
            for i in range(info.num_samples):
                key = primary.sample_key(s, i)
                found = [mp.get(key) for mp in maps]
                if any(f is None and how == "skip" for f, how in zip(found, nonmatch[1:])):
                    continue
                for f, how, m in zip(found, nonmatch[1:], members[1:]):
                    if f is None and how == "error":
                        raise DataError(f"cannot join: sample key {key!r} of {primary.root} is missing here (set "
                                        f"nonmatch: skip or none to allow it)", path=m.root)
                kept.append(i)
                matched.append([(-1, -1) if f is None else f for f in found])
            if kept:
                rows.append((s, np.asarray(kept, dtype=np.int64), np.asarray(matched, dtype=np.int64)))
                shards.append(ShardInfo(info.path, len(kept), info.format, info.size_bytes, info.mtime_ns))
        if not shards:
            raise DataError("the join leaves no sample (every primary key lacks a match in a nonmatch: skip dataset)",
                        path=primary.root)
        super().__init__(name, shards, on_error=primary.on_error)
        self.members, self.nonmatch, self._rows = members, nonmatch, rows
        self.root = primary.root

    def read(self, shard_id: int, indices) -> list[dict]:
        """Primary records at ``indices`` of joined shard ``shard_id``, each with ``JOIN`` (see the class)."""
        s, kept, matched = self._rows[shard_id]
        indices = [int(i) for i in indices]
        out = self.members[0].read(s, [int(kept[i]) for i in indices])
        for rec, i in zip(out, indices):
            parts = [rec]
            for m, (ms, mi) in zip(self.members[1:], matched[i]):
                parts.append(None if ms < 0 else m.read(int(ms), [int(mi)])[0])
            rec[JOIN] = parts
        return out

    def prefetch(self, shard_ids) -> None:
        self.members[0].prefetch([self._rows[s][0] for s in shard_ids])

    def sample_key(self, shard_id: int, index: int) -> str:
        s, kept, _ = self._rows[shard_id]
        return self.members[0].sample_key(s, int(kept[index]))

    def fingerprint(self) -> dict:
        """The members' fingerprints, their ``nonmatch`` and the joined shard sizes."""
        return {"name": self.name, "format": "energon-join", "nonmatch": self.nonmatch,
                "members": [m.fingerprint() for m in self.members], "shard_sizes": self.shard_sizes}
