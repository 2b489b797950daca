"""Integrity check of one opened tar shard against its ``.tar.idx`` and keys, for ``zephon inspect``.

Opening a ``TarShardReader`` already checks the ``.tar.idx`` against ``.nv-meta/.info.json`` (entry count)
and the tar (increasing offsets, none past its end); this adds what needs the tar's bytes, cheaply: the
first and the last sample parse at their indexed offsets with the indexed keys, and keys are unique.
A deep check (``formats.check``) reads every sample.
"""
from __future__ import annotations

from .tar_index import parse_sample


def tar_problems(reader, tar_size: int) -> list[str]:
    """What is wrong with an opened tar shard ([] when nothing).

    reader: a ``reader.TarShardReader``. tar_size: the tar's size in bytes.
    Each problem names the raw tar sample and says what the index expected and what the tar has.
    """
    off, keys, out = reader.off, reader.keys, []
    n = len(off) - 1
    if n and int(off[-1]) > tar_size:  # read_tar_index refuses this at open; kept for a tar changed since
        out.append(f"size: .tar.idx says the last sample ends at byte {int(off[-1]):,}, the tar has {tar_size:,} "
                   f"bytes (truncated?)")
        return out
    if reader.dups:
        shown = ", ".join(f"{k!r} (tar samples {v})" for k, v in list(reader.dups.items())[:3])
        out.append(f"keys: {len(reader.dups)} duplicate sample keys: {shown}; `energon prepare --fix-duplicates` "
                   f"renames them")
    for r in sorted({0, n - 1}) if n else []:
        lo, hi = int(off[r]), int(off[r + 1])
        span = reader.pread(hi - lo, lo)
        if len(span) != hi - lo:
            out.append(f"tar sample {r}: .tar.idx gives bytes [{lo:,}, {hi:,}), the tar ends first (truncated?)")
            continue
        try:
            key, _, _ = parse_sample(span)
        except ValueError as e:
            out.append(f"tar sample {r} at byte {lo:,} (.tar.idx): {e}")
            continue
        if key != keys[r]:
            out.append(f"tar sample {r} at byte {lo:,} has key {key!r}, the index lists {keys[r]!r}: .tar.idx / "
                       f"index.sqlite do not match the tar; re-run `energon prepare`")
    return out
