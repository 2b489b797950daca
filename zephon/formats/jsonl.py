"""JSON Lines shards: one JSON object per non-blank line, plain or gzip/zstd compressed.

Extensions: .jsonl, .json, .ndjson, each optionally followed by .gz or .zst/.zstd (see
``discovery.py``). A line holding only JSON whitespace (space, tab, CR, LF) is not a sample; every
other line is one, so a line that is not valid JSON is reported, never dropped.

Random access comes from a line index: an int64 array ``offsets`` of length ``num_samples + 1``
where sample ``i`` is the bytes ``[offsets[i], offsets[i+1])`` of the decompressed stream and the
last entry is the stream length. A span may carry the line's newline and any blank lines after it,
which ``json.loads`` ignores as trailing whitespace. Plain files are read with ``os.pread`` (no
shared file position, so threads can share a reader); compressed files are decompressed whole into
memory once (see ``codecs.py``) and sliced.
"""
from __future__ import annotations

import contextlib
import json
import threading
from typing import Iterable, Iterator, Sequence

import numpy as np

from .codecs import codec_of, iter_blocks, load_decompressed
from .errors import DataError, per_sample
from .fileio import PreadFile, coalesce_runs
from .index_cache import load_or_build

INDEX_KIND = "jsonl-line-offsets"
_JSON_TYPE_NAMES = {list: "an array", str: "a string", int: "a number", float: "a number",
                    bool: "a boolean", type(None): "null"}


def build_line_index(blocks: Iterable[bytes]) -> np.ndarray:
    """Line index of a byte stream given as consecutive blocks.

    Returns int64 ``[start_0, ..., start_{n-1}, total_length]`` over the n non-blank lines.
    Vectorised per block (newline search and a per-line "any non-whitespace byte" reduction), so the
    cost is a few ms per MiB and memory is a small multiple of one block.
    """
    out: list[np.ndarray] = []
    pos = 0                 # stream offset of the current block
    line_start = 0          # stream offset where the line being scanned began
    line_has_text = False   # whether that line has a non-whitespace byte so far
    for block in blocks:
        arr = np.frombuffer(block, dtype=np.uint8)
        if arr.size == 0:
            continue
        text = (arr != 32) & (arr != 10) & (arr != 9) & (arr != 13)  # JSON whitespace is exactly these
        nl = np.flatnonzero(arr == 10)
        # Segments of this block: [0, nl0+1), [nl0+1, nl1+1), ..., and a partial one after the last
        # newline unless the block ends with it. The first segment continues the carried line.
        seg = np.concatenate(([0], nl + 1))
        if seg[-1] == arr.size:
            seg = seg[:-1]
        has_text = np.logical_or.reduceat(text, seg)
        has_text[0] |= line_has_text
        starts = pos + seg.astype(np.int64)
        starts[0] = line_start
        done = len(nl)  # segments ending in a newline are complete lines
        out.append(starts[:done][has_text[:done]])
        if done < len(seg):
            line_start, line_has_text = int(starts[-1]), bool(has_text[-1])
        else:
            line_start, line_has_text = pos + arr.size, False
        pos += arr.size
    if line_has_text:  # final line without a trailing newline
        out.append(np.array([line_start], dtype=np.int64))
    out.append(np.array([pos], dtype=np.int64))
    return np.concatenate(out).astype(np.int64, copy=False)


class JsonlReader:
    """Random-access reader of one JSON Lines shard.

    path: absolute file path. shard: shard id, only used in error messages. columns: if given,
    records must have these keys and are projected to them (in that order). cache_dir: fallback
    index cache directory (see ``index_cache``). file: a remote file's cached copy (``remote.CachedFile``;
    ``path`` then names the object); None: read ``path``. Opening builds or loads the line index (``index_file``:
    the file it was loaded from, None if built now) and raises
    DataError for a truncated/corrupt compressed stream, OSError if the file cannot be read.
    """

    format = "jsonl"

    def __init__(self, path: str, *, shard: int | None = None, columns: Sequence[str] | None = None,
                 cache_dir: str | None = None, file=None):
        self.path = path
        self.shard = shard
        self.columns = tuple(columns) if columns is not None else None
        self.compressed = codec_of(path) is not None
        # plain files: opened on the first read; a remote file's cached copy (remote.CachedFile) is pinned per read
        self._file = file if file is not None else PreadFile(path, lazy=True)
        self._line_numbers: np.ndarray | None = None  # built on the first error
        self._lock = threading.Lock()  # guards _line_numbers
        try:
            with self._local() as p:
                self.offsets, self.index_file = load_or_build(p, INDEX_KIND, lambda: build_line_index(iter_blocks(p)),
                                                              cache_dir)
        except DataError as e:
            raise e.located(path=path, shard=shard) from e

    @contextlib.contextmanager
    def _local(self) -> Iterator[str]:
        """The local file to read whole: ``path``, or a remote file's cached copy (present and pinned)."""
        if isinstance(self._file, PreadFile):
            yield self.path
        else:
            with self._file.local() as p:
                yield p

    @property
    def num_samples(self) -> int:
        return len(self.offsets) - 1

    def sample_sizes(self) -> np.ndarray:
        """Bytes of each line (its newline included), from the line index: no sample is read."""
        return np.diff(self.offsets).astype(np.int64)

    def read(self, indices: Sequence[int], on_error: str = "raise") -> list[dict]:
        """Records for ``indices`` (already range-checked by the caller), in the given order.

        Each occurrence of a repeated index gets its own dict. on_error="skip" turns a bad sample
        into ``{"__error__": str(DataError)}``; "raise" raises the DataError.
        """
        wanted = sorted(set(int(i) for i in indices))
        raw = self._raw(wanted) if wanted else {}
        return per_sample(indices, lambda i: self._parse(i, raw[i]), on_error)

    def first_keys(self) -> list[str]:
        """Keys of the first record (unprojected), for ``inspect``; [] for an empty shard."""
        if self.num_samples == 0:
            return []
        rec = self._parse(0, self._raw([0])[0], project=False)
        return list(rec)

    def check(self, size: int | None = None) -> list[str]:
        """Cheap integrity check for ``zephon inspect`` ([] when nothing is wrong).

        size: the file's size in bytes (for a plain file the line index must cover exactly that many).
        Parses the first and the last sample (a file cut mid-record fails there); every sample is read only
        by a deep check. Each problem names the sample and line and says what was expected.
        """
        out = []
        if size is not None and not self.compressed and int(self.offsets[-1]) != size:
            out.append(f"index: the line index covers {int(self.offsets[-1]):,} bytes, the file has {size:,} "
                       f"(changed while being opened?)")
        n = self.num_samples
        if n == 0:
            return out + ["no samples: the file holds no non-blank line"]
        for i in sorted({0, n - 1}):
            try:
                self._parse(i, self._raw([i])[i], project=False)
            except DataError as e:
                out.append(f"sample {i} (line {e.line}): {e.reason}" + (" (file cut mid-record?)" if i == n - 1
                                                                       and i else ""))
        return out

    def _raw(self, wanted: list[int]) -> dict[int, bytes]:
        off = self.offsets
        if self.compressed:
            with self._local() as p:
                data = load_decompressed(p)
            if len(data) != off[-1]:
                raise DataError("file changed since it was indexed", path=self.path, shard=self.shard)
            return {i: data[off[i]:off[i + 1]] for i in wanted}
        raw = {}
        for a, b in coalesce_runs(wanted, off):
            lo, hi = int(off[a]), int(off[b + 1])
            buf = self._file(hi - lo, lo)
            if len(buf) != hi - lo:
                raise DataError("file is shorter than its index (changed since it was indexed?)",
                                path=self.path, shard=self.shard, sample=a)
            for i in range(a, b + 1):
                raw[i] = buf[int(off[i]) - lo:int(off[i + 1]) - lo]
        return raw

    def _parse(self, i: int, raw: bytes, project: bool = True) -> dict:
        try:
            rec = json.loads(raw)
        except json.JSONDecodeError as e:
            where = f" (column {e.colno})" if e.lineno == 1 else f" ({e})"
            self._fail(i, f"invalid JSON: {e.msg}{where}{self._stale_hint()}")
        except UnicodeDecodeError as e:
            self._fail(i, f"invalid UTF-8: {e}{self._stale_hint()}")
        except RecursionError:
            self._fail(i, "invalid JSON: nested too deeply")
        if not isinstance(rec, dict):
            kind = _JSON_TYPE_NAMES.get(type(rec), type(rec).__name__)
            self._fail(i, f"expected a JSON object, got {kind}")
        if project and self.columns is not None:
            missing = [c for c in self.columns if c not in rec]
            if missing:
                self._fail(i, f"missing column {missing[0]!r} (record has: {', '.join(map(repr, rec))})")
            rec = {c: rec[c] for c in self.columns}
        return rec

    def _stale_hint(self) -> str:
        """For a line that does not parse: the line index it was cut by, when loaded from a file, may be stale
        (its stamp misses an edit confined to the middle of the file with size and mtime kept; documented in
        ``index_cache``), and then it is the index, not the data, that is wrong."""
        if self.index_file is None:
            return ""
        return (f"; if this file was edited in place keeping its size and mtime, its line index {self.index_file} "
                f"may be stale: delete that file (it is rebuilt on the next open) and retry")

    def _fail(self, i: int, reason: str):
        if self.path.lower().split(".")[-1] == "json" and i == 0:
            reason += " (.json files are read as JSON Lines: one object per line)"
        raise DataError(reason, path=self.path, shard=self.shard, sample=i, line=self._line_number(i))

    def locate(self, i: int) -> dict:
        """Sample ``i``'s ``line`` (1-based) and ``bytes`` (``[start, stop)`` of its line, newline included, in the
        decompressed stream)."""
        return {"line": self._line_number(i), "bytes": [int(self.offsets[i]), int(self.offsets[i + 1])]}

    def _line_number(self, i: int) -> int:
        """1-based line number of sample i. Error path and ``locate`` only: the first call counts the newlines of
        the whole stream once (so skip mode over many bad lines stays linear), later calls look up."""
        with self._lock:
            if self._line_numbers is None:
                newlines, pos = [], 0
                with self._local() as p:
                    for block in ([load_decompressed(p)] if self.compressed else iter_blocks(p)):
                        newlines.append(np.flatnonzero(np.frombuffer(block, dtype=np.uint8) == 10) + pos)
                        pos += len(block)
                nl = np.concatenate(newlines) if newlines else np.zeros(0, dtype=np.int64)
                self._line_numbers = np.searchsorted(nl, self.offsets[:-1]) + 1
        return int(self._line_numbers[i])

    def close(self) -> None:
        """Release the file descriptor (the reader reopens it if used again)."""
        self._file.close()
