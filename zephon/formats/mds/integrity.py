"""MDS shard integrity: file hashes against ``index.json``, and sample offsets against the shard's size.

Offsets. A raw shard starts ``[n: uint32] [offsets: (n + 1) uint32]``; sample ``i`` is the bytes
``[offsets[i], offsets[i + 1])`` of the shard and ``offsets[n]`` is its size. ``streaming.MDSWriter``
computes the offsets as int64 and stores them cast to uint32, so in a shard past 4 GiB (possible with
``size_limit=None``, or one sample larger than ``size_limit``) every stored offset is the true one
modulo 2**32. True offsets never decrease, so they are recovered by adding 2**32 each time a stored
value decreases, and the result is exact if and only if the last one then equals the shard's size
(each gap is the stored gap plus a multiple of 2**32, and those multiples sum to zero). A shard whose
offsets do not recover so is refused as a whole: its samples cannot be located without risking another
sample's bytes.
"""
from __future__ import annotations

import hashlib
import os
import threading

import numpy as np

from ..errors import DataError

XXHASH_ALGORITHMS = ("xxh32", "xxh64", "xxh128", "xxh3_64", "xxh3_128")
OFFSET_WRAP = 1 << 32          # stored offsets are uint32: true offsets modulo this
_HASH_BLOCK = 4 << 20          # bytes read per step when hashing a file


class ShardRefused(ValueError):
    """The offsets of a shard cannot be trusted for any sample (the reason; the reader adds file and shard)."""


def unwrap_offsets(stored: np.ndarray) -> np.ndarray:
    """True byte offsets from offsets stored modulo 2**32.

    stored: shape (n + 1,), the uint32 offsets of a shard header. Returns int64 of the same shape: each
    value plus 2**32 times the number of decreases before it (exact for a shard written by MDSWriter;
    ``sample_offsets`` checks it against the shard's size).
    """
    off = np.asarray(stored).astype(np.int64)
    if len(off) > 1:
        wraps = np.concatenate(([0], np.cumsum(np.diff(off) < 0)))
        off += wraps * OFFSET_WRAP
    return off


def sample_offsets(stored: np.ndarray, *, shard_size: int, indexed_size: int,
                   header_end: int) -> tuple[np.ndarray, np.ndarray]:
    """Byte offsets of a shard's samples and which samples they locate safely.

    stored: shape (n + 1,), the uint32 offsets read from the shard header. shard_size: bytes of the
    shard as read (on disk; decompressed size for a compressed shard). indexed_size: ``raw_data.bytes``
    from index.json. header_end: first byte after the offsets (``4 + 4 * (n + 1)``).
    Returns ``(offsets, readable)``: int64 shape (n + 1,) and bool shape (n,).

    A shard that is, or by index.json should be, 4 GiB or more has wrapped offsets: they are unwrapped
    and must end exactly at ``shard_size`` (then every sample is readable). A smaller shard's offsets
    are exact: they must not end before ``shard_size`` (bytes no sample owns); a sample bounded by an
    offset outside ``[header_end, shard_size]`` (a truncated shard, a damaged offset) or by one of two
    offsets that decrease is not readable, the others are (a damaged offset costs its two samples, not
    the shard). Raises ShardRefused (a ValueError) with the reason otherwise.
    """
    if max(shard_size, indexed_size) >= OFFSET_WRAP:
        off = unwrap_offsets(stored)
        if int(off[-1]) != shard_size:
            raise ShardRefused(
                f"shard of {shard_size} bytes (index.json: {indexed_size}) is past 4 GiB, where MDS offsets are "
                f"stored modulo 2**32; unwrapped, they end at byte {int(off[-1])} instead of the shard's size, so "
                f"they are inconsistent (or the file was truncated or extended) and no sample can be located safely")
        if len(off) > 1 and int(off[0]) < header_end:
            raise ShardRefused(f"the first sample starts at byte {int(off[0])}, inside the header "
                               f"(which ends at {header_end})")
        return off, np.ones(len(off) - 1, dtype=bool)
    off = np.asarray(stored).astype(np.int64)
    if int(off[-1]) < shard_size:
        raise ShardRefused(f"the offsets end at byte {int(off[-1])} but the shard has {shard_size} bytes "
                           f"({shard_size - int(off[-1])} bytes after the last sample): the header does not "
                           f"describe this file")
    # An offset outside the shard is wrong. Of two in-range offsets that decrease, one is wrong and
    # nothing says which, so both are distrusted: a sample bounded by a distrusted offset could span
    # a neighbour's bytes. The other samples are located exactly.
    suspect = (off < header_end) | (off > shard_size)
    inside = np.flatnonzero(~suspect)
    drop = off[inside[:-1]] > off[inside[1:]]
    suspect[inside[:-1][drop]] = True
    suspect[inside[1:][drop]] = True
    readable = ~suspect[:-1] & ~suspect[1:]
    return off, readable


def hash_algorithms() -> tuple[str, ...]:
    """Names accepted by ``validate_hash``: hashlib's (sha*, sha3_*, md5, blake2b/s) and xxhash's."""
    names = {a for a in hashlib.algorithms_available if hasattr(hashlib, a) and not a.startswith("shake_")}
    return tuple(sorted(names | set(XXHASH_ALGORITHMS)))


def hasher(algo: str):
    """A new hash object for ``algo`` (a name from ``hash_algorithms()``).

    Raises ValueError for an unknown name, ImportError for an xxhash algorithm without the xxhash package.
    """
    if algo in XXHASH_ALGORITHMS:
        try:
            import xxhash
        except ImportError:
            raise ImportError(f"validate_hash={algo!r} needs the 'xxhash' package (pip install xxhash)") from None
        return getattr(xxhash, algo)()
    if algo.startswith("shake_") or not hasattr(hashlib, algo):
        raise ValueError(f"unknown hash algorithm {algo!r} (one of: {', '.join(hash_algorithms())})")
    return getattr(hashlib, algo)()


def file_digest(path: str, algo: str) -> str:
    """Hex digest of a file's content with ``algo`` (read in blocks of 4 MiB)."""
    h = hasher(algo)
    with open(path, "rb") as f:
        while block := f.read(_HASH_BLOCK):
            h.update(block)
    return h.hexdigest()


def digest_bytes(data: bytes, algo: str) -> str:
    """Hex digest of ``data`` with ``algo``."""
    h = hasher(algo)
    h.update(data)
    return h.hexdigest()


_validated: set = set()       # (path, size, mtime_ns, algo, digest) checked in this process
_validated_lock = threading.Lock()


def check_hash(path: str, algo: str, expected: str, shard: int | None, what: str) -> None:
    """Check a file against the digest index.json recorded, once per process per file version.

    path: the file. algo: hash algorithm. expected: hex digest from index.json. shard: shard id for the
    message. what: names the file in the message (e.g. "the compressed shard").
    Raises DataError naming file and shard on a mismatch.
    """
    st = os.stat(path)
    key = (path, st.st_size, st.st_mtime_ns, algo, expected)
    with _validated_lock:
        if key in _validated:
            return
    got = file_digest(path, algo)
    if got != expected.lower():
        raise DataError(f"{algo} checksum mismatch for {what} (index.json says {expected}, file has {got})",
                        path=path, shard=shard)
    with _validated_lock:
        _validated.add(key)


def _runs(ids: np.ndarray) -> str:
    """``"3, 7-9, 12"`` for sorted sample ids (at most 4 runs shown)."""
    if not len(ids):
        return ""
    breaks = np.flatnonzero(np.diff(ids) != 1)
    starts = np.concatenate(([ids[0]], ids[breaks + 1]))
    ends = np.concatenate((ids[breaks], [ids[-1]]))
    parts = [f"{a}" if a == b else f"{a}-{b}" for a, b in zip(starts.tolist(), ends.tolist())]
    return ", ".join(parts[:4]) + (", ..." if len(parts) > 4 else "")


def size_problem(field: str, expected: int, found: int) -> str | None:
    """The size mismatch of a shard file against index.json, or None.

    field: ``"raw_data"`` or ``"zip_data"`` (which entry describes the file). expected: its ``bytes``.
    found: the file's size on disk.
    """
    if found == expected:
        return None
    cut = " (truncated?)" if found < expected else ""
    return f"size: index.json {field}.bytes says {expected:,} bytes, the file has {found:,}{cut}"


def shard_problems(*, compressed: bool, read_size: int, raw_bytes: int, offsets: np.ndarray,
                   readable: np.ndarray) -> list[str]:
    """What is wrong with one opened MDS shard compared with its ``index.json`` entry ([] when nothing);
    the file's own size is ``size_problem``'s job.

    compressed: the shard was read from its ``zip_data`` file (decompressed). read_size: bytes of the raw
    shard as read (the decompressed copy for a compressed shard). raw_bytes: ``raw_data.bytes`` from
    index.json. offsets: int64 shape (n + 1,), the header's sample offsets (``sample_offsets``). readable:
    bool shape (n,), which samples those offsets locate inside the shard.
    Each problem says what index.json or the header expected and what the shard has.
    """
    out = []
    if read_size != raw_bytes and compressed:
        out.append(f"size: index.json raw_data.bytes says {raw_bytes:,} bytes, the decompressed shard has "
                   f"{read_size:,}")
    end = int(offsets[-1]) if len(offsets) else 0
    if end != raw_bytes:
        out.append(f"header: the sample offsets end at byte {end:,}, index.json raw_data.bytes says {raw_bytes:,}")
    bad = np.flatnonzero(~np.asarray(readable, dtype=bool))
    if len(bad):
        i = int(bad[0])
        a, b = int(offsets[i]), int(offsets[i + 1])
        why = (f"past the end of the {read_size:,}-byte shard" if max(a, b) > read_size
               else "bounded by offsets that are out of order or inside the header")
        out.append(f"header: {len(bad)} of {len(readable)} samples cannot be located (samples {_runs(bad)}); "
                   f"sample {i} spans bytes [{a:,}, {b:,}), {why}")
    return out
