"""Energon's ``.tar.idx`` offset files, and reading one sample of a tar by its byte range.

``data-000.tar.idx`` (written by ``energon prepare`` next to ``data-000.tar``) is a flat array of
little-endian uint64 byte offsets: entry ``i`` is where sample ``i``'s first member header starts, and a
final entry is where the last sample ends, so a shard of ``n`` samples has ``n + 1`` entries. Sample ``i``
is exactly the bytes ``[idx[i], idx[i + 1])``: it is read with one ``pread`` and its members are parsed
from memory with the stdlib ``tarfile`` header parser (ustar, GNU long names and pax headers). Sample keys
come from ``.nv-meta/index.sqlite`` when ``energon prepare`` wrote it, else from each sample's first header.
"""
from __future__ import annotations

import io
import os
import sqlite3
import tarfile

import numpy as np

from ..errors import DataError
from .nvmeta import INDEX_SQLITE, MAIN_FOLDER
from .wds import split_name

ITAR_SUFFIX = ".tar.idx"
_HEAD_READ = 8192      # bytes read to find a sample's key (more when its headers are longer)


def itar_path(tar_path: str) -> str:
    """``shard.tar`` -> ``shard.tar.idx`` (Energon's ``with_suffix(".tar.idx")``: the last suffix is replaced)."""
    root, _ext = os.path.splitext(tar_path)
    return root + ITAR_SUFFIX


def read_tar_index(idx_path: str, tar_size: int, count: int, *, tar_path: str, shard: int | None = None) -> np.ndarray:
    """The uint64 offsets of a ``.tar.idx`` as an int64 array of ``count + 1`` entries (bytes into the tar).

    idx_path: the ``.tar.idx`` file. tar_size: the tar's size in bytes. count: the tar's sample count
    (from ``.info.json``). tar_path / shard: named in errors.
    Raises DataError (naming the tar) when the index is missing (suggesting ``energon prepare``), has
    another number of entries than ``count + 1`` (``count`` from ``.info.json``), is not strictly
    increasing, or points past the end of the tar.
    """
    try:
        with open(idx_path, "rb") as f:
            raw = f.read()
    except FileNotFoundError:
        raise DataError(f"no tar index {os.path.basename(idx_path)} next to the tar: run `energon prepare "
                        f"<dataset root>` (megatron-energon) to index the shards", path=tar_path, shard=shard) from None
    except OSError as e:
        raise DataError(f"cannot read tar index {idx_path}: {e.strerror or e}", path=tar_path, shard=shard) from None
    if len(raw) % 8:
        raise DataError(f"tar index {os.path.basename(idx_path)} is {len(raw)} bytes, not a multiple of 8 "
                        f"(truncated?); re-run `energon prepare`", path=tar_path, shard=shard)
    off = np.frombuffer(raw, dtype="<u8").astype(np.int64)
    if len(off) != count + 1:
        raise DataError(f"tar index {os.path.basename(idx_path)} has {len(off)} offsets, expected {count + 1} "
                        f"({count} samples in .nv-meta/.info.json + 1); the index or .info.json is stale: "
                        f"re-run `energon prepare`", path=tar_path, shard=shard)
    if count and (np.any(np.diff(off) <= 0) or off[0] < 0):
        raise DataError(f"tar index {os.path.basename(idx_path)}: offsets not strictly increasing; re-run "
                        f"`energon prepare`", path=tar_path, shard=shard)
    if int(off[-1]) > tar_size:
        raise DataError(f"tar index {os.path.basename(idx_path)} points to byte {int(off[-1])}, past the end of "
                        f"the tar ({tar_size} bytes): truncated tar or stale index", path=tar_path, shard=shard)
    return off


class _SpanTar(tarfile.TarFile):
    """A TarFile over the bytes of one sample: does not read a first member on construction
    (the same trick as Energon's ITarFile), so parsing starts at byte 0 of the span."""

    def __init__(self, *args, **kwargs):
        self._zephon_init = True
        try:
            super().__init__(*args, **kwargs)
        finally:
            self._zephon_init = False

    def next(self):
        if self._zephon_init:
            return None
        return super().next()


def parse_sample(span: bytes, *, parts_wanted=None, key_only: bool = False):
    """Members of one sample from its bytes.

    span: the tar bytes ``[idx[i], idx[i + 1])`` of sample ``i``.
    parts_wanted: None for all parts, else a container or callable deciding by part name (Energon's
    ``part_filter``); other members are skipped without copying.
    key_only: stop after the first member (then the dict is empty); the span may then be just a prefix.
    Returns ``(key, {part name: raw bytes}, [member names])`` with members in tar order (a repeated part
    name keeps the last one, as Energon does).
    Raises ValueError with the reason for a bad header, a member running past the span, no member with a
    key, or members with different keys (caller adds file/shard/sample).
    """
    tf = _SpanTar(fileobj=io.BytesIO(span), mode="r")
    key = None
    parts: dict[str, bytes] = {}
    names: list[str] = []
    n = len(span)
    while tf.offset < n:
        ti = _next_member(tf)
        if not ti.isreg():
            continue
        kp = split_name(ti.name)
        if kp is None:
            continue
        k, part = kp
        if key is None:
            key = k
            if key_only:
                return key, parts, names
        elif k != key:
            raise ValueError(f"member {ti.name!r} has key {k!r}, but the sample started with key {key!r} "
                             f"(the .tar.idx offsets do not match the tar; re-run `energon prepare`)")
        if parts_wanted is not None and not (parts_wanted(part) if callable(parts_wanted) else part in parts_wanted):
            continue
        parts[part] = _member_data(tf, ti, span)
        names.append(ti.name)
    if key is None:
        raise ValueError("no sample member (no regular file named <key>.<part>) at this offset: the .tar.idx "
                         "offsets do not match the tar; re-run `energon prepare`")
    return key, parts, names


def _next_member(tf: tarfile.TarFile) -> tarfile.TarInfo:
    """The next member header of a sample's tar span.

    tf: the span's tar reader, positioned at a header before the span's end.
    Raises ValueError (with the byte offset in the sample) for a header that is damaged or not there.
    """
    at = tf.offset
    try:
        ti = tf.next()
    except tarfile.TarError as e:
        raise ValueError(f"corrupt tar header at byte +{at} of the sample ({e})") from None
    if ti is None:
        raise ValueError(f"corrupt or missing tar header at byte +{at} of the sample (the .tar.idx offsets "
                         f"do not match the tar, or the tar is damaged; re-run `energon prepare`)")
    return ti


def _member_data(tf: tarfile.TarFile, ti: tarfile.TarInfo, span: bytes) -> bytes:
    """The bytes of member ``ti`` (sliced from ``span``; a sparse member through ``tf``).

    tf: the span's tar reader. ti: a regular member of it. span: the sample's tar bytes.
    Raises ValueError when the member runs past the end of the span.
    """
    if ti.sparse is not None:
        data = tf.extractfile(ti).read()
    else:
        lo = ti.offset_data
        data = span[lo:lo + ti.size]
    if len(data) != ti.size:
        raise ValueError(f"member {ti.name!r} ({ti.size} bytes) runs past the end of the sample (truncated "
                         f"tar, or .tar.idx offsets that do not match it)")
    return bytes(data)


def sample_key_at(pread, start: int, end: int) -> str:
    """Key of the sample whose bytes are ``[start, end)`` of a tar, reading only its first header(s).

    pread: ``pread(n, at) -> bytes`` over the tar. start / end: byte offsets (from ``read_tar_index``).
    Raises ValueError like ``parse_sample``, or when the tar ends before ``end``.
    """
    n = end - start
    if n > _HEAD_READ:
        try:
            return parse_sample(pread(_HEAD_READ, start), key_only=True)[0]
        except ValueError:
            pass  # long pax/GNU headers or a damaged header: retry with the whole sample
    span = pread(n, start)
    if len(span) != n:
        raise ValueError(f"tar truncated: wanted {n} bytes at {start}, got {len(span)}")
    return parse_sample(span, key_only=True)[0]


def sqlite_keys(root: str, info_pos: int, count: int) -> list[str] | None:
    """Sample keys of one tar from ``.nv-meta/index.sqlite`` (written by ``energon prepare``).

    root: dataset root. info_pos: the tar's position in ``.info.json`` (the table's ``tar_file_id``).
    count: the tar's sample count.
    Returns the keys by sample index, or None when there is no usable table (then read the headers).
    """
    db = os.path.join(root, MAIN_FOLDER, INDEX_SQLITE)
    if not os.path.isfile(db):
        return None
    try:
        con = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
        try:
            rows = con.execute("SELECT sample_index, sample_key FROM samples WHERE tar_file_id = ? "
                               "ORDER BY sample_index", (info_pos,)).fetchall()
        finally:
            con.close()
    except sqlite3.Error:
        return None
    if len(rows) != count or any(r[0] != i for i, r in enumerate(rows)):
        return None  # stale or partial table: the tar headers are the truth
    return [r[1] for r in rows]


def list_keys(root: str, info_pos: int, off: np.ndarray, pread, *, tar_path: str,
              shard: int | None) -> tuple[list[str], bool]:
    """Sample keys of one tar, by sample index.

    root: dataset root. info_pos: the tar's position in ``.info.json``. off: its ``read_tar_index``
    offsets (``count + 1`` entries). pread: ``pread(n, at) -> bytes`` over the tar. tar_path / shard:
    named in errors.
    Returns ``(keys, from_sqlite)``: from index.sqlite when it has this tar, else by reading each
    sample's first header through the offsets (random access, no scan).
    Raises DataError naming the tar and sample for a header that does not parse.
    """
    count = len(off) - 1
    keys = sqlite_keys(root, info_pos, count)
    if keys is not None:
        return keys, True
    out = []
    for i in range(count):
        try:
            out.append(sample_key_at(pread, int(off[i]), int(off[i + 1])))
        except ValueError as e:
            raise DataError(f"tar sample {i}: {e}", path=tar_path, shard=shard) from None
    return out, False
