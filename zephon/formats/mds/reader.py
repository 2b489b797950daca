"""Random access to the samples of one MDS shard, as written by ``streaming.MDSWriter``.

A raw shard file (all integers uint32 little endian)::

    [n: 4 bytes] [offsets: (n + 1) * 4 bytes] [writer config JSON] [sample 0] ... [sample n-1]

Sample ``i`` is the bytes ``[offsets[i], offsets[i+1])`` (absolute positions, stored modulo 2**32: see
``integrity``). A sample is ``[size of each variable-size column: 4 bytes each, in column order]
[column 0] [column 1] ...``; a column with a fixed size (``column_sizes[c]`` not null) has no size entry.

Opening a shard: (1) with ``validate_hash``, hash the file read (once per process per file); (2) a
compressed shard without its raw file next to it is decompressed once (``decompress``); (3) read the
header, ``4 + 4 * (n + 1)`` bytes, and check the offsets (``integrity.sample_offsets``). Records are
then read with ``os.pread`` (no shared file position: a reader is shared by threads), only the bytes of
the requested samples (neighbouring samples coalesced into one read of at most 16 MiB), and only the
requested columns are decoded.
"""
from __future__ import annotations

import os
from typing import Sequence

import numpy as np

from ..errors import DataError, per_sample
from ..fileio import PreadFile, coalesce_runs, pread_spans
from .decompress import decompress_shard
from .encodings import column_codec
from .index import FORMAT, ShardMeta
from .integrity import ShardRefused, check_hash, digest_bytes, sample_offsets, size_problem


class MdsReader:
    """Random-access reader of one MDS shard (thread-safe).

    meta: the shard's index entry. path: the file to read (``data_file(meta)``): the raw shard, or the
    compressed one, which is then decompressed into ``cache_dir`` first. shard: shard id for error
    messages. columns: return only these columns, in this order (None = all, in index order).
    validate_hash: algorithm whose digest from index.json the file must match (checked once per
    process per file). file: the raw shard's bytes as a ``pread(n, at)`` callable with ``size()`` and
    ``close()`` (a remote shard's cached copy, ``path`` then only names it); None: read ``path``.
    Opening raises DataError (naming file and shard) for a hash mismatch, a file size index.json does not
    describe (``raw_data``/``zip_data`` bytes: see ``_read_header``), corrupt
    compressed data, a header that is truncated or disagrees with index.json, or offsets that cannot be
    trusted (``integrity.sample_offsets``); OSError if unreadable.
    """

    format = FORMAT

    def __init__(self, meta: ShardMeta, path: str, *, shard: int | None = None, columns: Sequence[str] | None = None,
                 cache_dir: str | None = None, validate_hash: str | None = None, file=None):
        self.meta = meta
        self.path = path
        self.shard = shard
        self.columns = tuple(columns) if columns is not None else None
        self._file: PreadFile | None = file
        self._mem: bytes | None = None
        compressed = file is None and meta.zip is not None and path == meta.zip_path
        if compressed:  # one stat: a zip_data size that lies is refused before any decompression (as on download)
            problem = size_problem("zip_data", meta.zip.bytes, os.stat(path).st_size)
            if problem:
                raise DataError(f"{problem}: index.json does not describe this compressed shard", path=path,
                                shard=shard)
        if validate_hash:
            entry = meta.zip if compressed else meta.raw
            check_hash(path, validate_hash, entry.hashes[validate_hash], shard,
                       "the compressed shard" if compressed else "the shard")
        self.read_path = path
        if compressed:
            self.read_path, self._mem = decompress_shard(meta, cache_dir, shard)
            if validate_hash and validate_hash in meta.raw.hashes:
                if self._mem is None:
                    check_hash(self.read_path, validate_hash, meta.raw.hashes[validate_hash], shard,
                               f"the decompressed copy of {path}")
                elif digest_bytes(self._mem, validate_hash) != meta.raw.hashes[validate_hash].lower():
                    raise DataError(f"{validate_hash} checksum mismatch after decompression", path=path, shard=shard)
        if self._mem is None:
            if self._file is None:
                self._file = PreadFile(self.read_path)
            self.file_size = self._file.size()
        else:
            self.file_size = len(self._mem)
        self._read_header()
        # per column: (name, decoder, fixed size or None); which columns to return
        self._layout = [(n, column_codec(e)[0], s) for n, e, s in
                        zip(meta.column_names, meta.column_encodings, meta.column_sizes)]
        self._n_var = sum(1 for *_, s in self._layout if s is None)
        wanted = self.columns if self.columns is not None else meta.column_names
        self._want = {c: k for k, c in enumerate(wanted)}

    def _fail(self, reason: str, sample: int | None = None):
        where = f" (in its decompressed copy {self.read_path})" if self.read_path != self.path else ""
        raise DataError(reason + where, path=self.path, shard=self.shard, sample=sample)

    def _read_header(self) -> None:
        n = self.meta.samples
        head = self._pread(4, 0)
        if len(head) < 4:
            self._fail(f"truncated shard: {self.file_size} bytes, too short for the sample count")
        count = int.from_bytes(head, "little")
        if count != n:
            self._fail(f"shard header says {count} samples, index.json says {n}")
        need = 4 * (n + 1)
        if 4 + need > self.file_size:  # checked before reading: a bad count must not allocate gigabytes
            self._fail(f"truncated shard: {self.file_size} bytes, too short for the offsets of {n} samples")
        raw = self._pread(need, 4)
        if len(raw) != need:
            self._fail(f"truncated shard: {self.file_size} bytes, too short for the offsets of {n} samples")
        self.header_end = 4 + need
        try:
            self.offsets, self._ok = sample_offsets(np.frombuffer(raw, "<u4"), shard_size=self.file_size,
                                                    indexed_size=self.meta.raw.bytes, header_end=self.header_end)
        except ShardRefused as e:
            self._fail(f"bad offsets: {e}")
        indexed, end = self.meta.raw.bytes, int(self.offsets[-1])
        if self.file_size != indexed and end != indexed:
            # index.json agrees with neither the file nor its header (a download of it would be refused). A
            # truncated file, whose offsets still end where index.json says, keeps its intact samples readable.
            self._fail(f"{size_problem('raw_data', indexed, self.file_size)} and its header's sample offsets end "
                       f"at byte {end:,}: index.json does not describe this shard")

    @property
    def num_samples(self) -> int:
        return self.meta.samples

    def first_keys(self) -> list[str]:
        """Column names (requested ones if given), for ``inspect``."""
        return list(self.columns if self.columns is not None else self.meta.column_names)

    def read(self, indices: Sequence[int], on_error: str = "raise") -> list[dict]:
        """Records for ``indices`` (already range-checked by the caller), in the given order.

        indices: sample ids of this shard, any order, repeats allowed (each occurrence gets its own dict).
        on_error: "skip" turns a bad sample into ``{"__error__": str(DataError)}``; "raise" raises the DataError.
        """
        wanted = sorted(set(int(i) for i in indices))
        raw, bad = self._raw(wanted)

        def read_one(i):
            if i in bad:
                raise bad[i]
            return self.decode(i, raw[i])
        return per_sample(indices, read_one, on_error)

    def _unreadable(self, i: int) -> DataError:
        """Why sample ``i`` is not readable (``integrity.sample_offsets`` said so), as a DataError."""
        off, size = self.offsets, self.file_size
        a, b = int(off[i]), int(off[i + 1])
        if not (self.header_end <= a <= size and self.header_end <= b <= size):
            hint = " (truncated shard?)" if b > size else (" (offsets decrease)" if b < a else "")
            reason = (f"offsets out of range: sample spans bytes [{a}, {b}) of a {size}-byte shard whose "
                      f"header ends at {self.header_end}{hint}")
        else:
            around = off[max(i - 1, 0):i + 3].tolist()
            reason = (f"offsets not increasing around this sample ({around} from offset {max(i - 1, 0)}): one "
                      f"is damaged and nothing says which, so its bytes [{a}, {b}) cannot be trusted")
        return DataError(reason, path=self.path, shard=self.shard, sample=i)

    def _raw(self, wanted: list[int]) -> tuple[dict, dict]:
        off, ok = self.offsets, self._ok
        raw: dict[int, bytes] = {}
        bad: dict[int, DataError] = {i: self._unreadable(i) for i in wanted if not ok[i]}
        good = [i for i in wanted if ok[i]]
        runs = list(coalesce_runs(good, off))
        spans = [(int(off[a]), int(off[b + 1])) for a, b in runs]
        # one call for all runs: a remote cached copy is then located and pinned once per read, not once per run
        bufs = [self._mem[lo:hi] for lo, hi in spans] if self._mem is not None else pread_spans(self._file, spans)
        for (a, b), (lo, hi), buf in zip(runs, spans, bufs):
            if len(buf) != hi - lo:
                for i in range(a, b + 1):
                    bad[i] = DataError("shard is shorter than its header says (changed since opened?)",
                                       path=self.path, shard=self.shard, sample=i)
                continue
            for i in range(a, b + 1):
                raw[i] = buf[int(off[i]) - lo:int(off[i + 1]) - lo]
        return raw, bad

    def decode(self, i: int, data: bytes) -> dict:
        """Decode sample ``i`` from its bytes into ``{column: value}``; DataError names the column."""
        n_var = self._n_var
        if len(data) < 4 * n_var:
            self._fail(f"sample is {len(data)} bytes, too short for its {n_var} column sizes", i)
        var_sizes = np.frombuffer(data, "<u4", n_var).tolist() if n_var else []
        at, v = 4 * n_var, 0
        spans = []
        for _, _, fixed in self._layout:
            if fixed is None:
                size, v = var_sizes[v], v + 1
            else:
                size = fixed
            spans.append((at, at + size))
            at += size
        if at != len(data):
            self._fail(f"sample is {len(data)} bytes but its column sizes add up to {at}", i)
        view = memoryview(data)
        out: list = [None] * len(self._want)
        for (name, dec, _), (a, b) in zip(self._layout, spans):
            k = self._want.get(name)
            if k is None:
                continue
            try:
                out[k] = (name, dec(view[a:b]))
            except Exception as e:  # decoders see untrusted bytes: any failure is bad data
                enc = self.meta.column_encodings[self.meta.column_names.index(name)]
                self._fail(f"column {name!r} ({enc}) does not decode: {type(e).__name__}: {e}", i)
        return dict(out)

    def _pread(self, n: int, at: int) -> bytes:
        if self._mem is not None:
            return self._mem[at:at + n]
        return self._file(n, at)

    def close(self) -> None:
        """Release the file descriptor."""
        if self._file is not None:
            self._file.close()
