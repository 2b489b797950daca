"""Parquet shards through ``pyarrow.parquet``: one row = one sample.

Sample counts come from the file footer (no data read). Random access is row-group aware: sample
ids map to row groups by a binary search over the cumulative row counts, only the needed row groups
are read, with only the requested columns, and the last ``ROW_GROUP_CACHE`` of them are kept per
reader (reads are usually clustered, e.g. a chunk of consecutive samples).
"""
from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Sequence

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from .errors import DataError

ROW_GROUP_CACHE = 2


class ParquetReader:
    """Random-access reader of one Parquet shard.

    path: absolute file path. shard: shard id for error messages. columns: columns to read and
    return (None = all). file: a seekable binary file to read instead of ``path`` (a remote object read by
    byte ranges, ``remote.RangeFile``: the footer, then only the row groups asked for). Raises DataError at
    open time when the file is not readable Parquet or a requested column is absent (the message lists the
    columns present); OSError if it cannot be opened.
    """

    format = "parquet"

    def __init__(self, path: str, *, shard: int | None = None, columns: Sequence[str] | None = None,
                 cache_dir: str | None = None, file=None):  # cache_dir: unused, same signature as JsonlReader
        self.path = path
        self.shard = shard
        self.columns = list(columns) if columns is not None else None
        try:
            self._file = pq.ParquetFile(file if file is not None else path)
        except pa.ArrowException as e:
            raise DataError(f"not a readable Parquet file: {e}", path=path, shard=shard) from e
        meta = self._file.metadata
        self.schema_columns = list(self._file.schema_arrow.names)
        if self.columns is not None:
            for c in self.columns:
                if c not in self.schema_columns:
                    raise DataError(f"missing column {c!r} (file has: {', '.join(map(repr, self.schema_columns))})",
                                    path=path, shard=shard)
        counts = [meta.row_group(g).num_rows for g in range(meta.num_row_groups)]
        # ends[g] = first sample id after row group g
        self._ends = np.cumsum(np.asarray(counts, dtype=np.int64))
        self._groups: OrderedDict[int, pa.Table] = OrderedDict()
        self._lock = threading.Lock()  # ParquetFile and the row-group cache are shared by threads

    @property
    def num_samples(self) -> int:
        return int(self._ends[-1]) if len(self._ends) else 0

    def read(self, indices: Sequence[int], on_error: str = "raise") -> list[dict]:
        """Records for ``indices`` (already range-checked by the caller), in the given order.

        A row group that cannot be decoded raises DataError naming the first affected sample, or in
        on_error="skip" mode yields ``{"__error__": ...}`` for each affected sample.
        """
        idx = np.asarray(indices, dtype=np.int64).reshape(-1)
        out: list[dict | None] = [None] * len(idx)
        groups = np.searchsorted(self._ends, idx, side="right")
        for g in np.unique(groups):
            pos = np.flatnonzero(groups == g)
            first = int(self._ends[g - 1]) if g > 0 else 0
            try:
                rows = self._row_group(int(g)).take(pa.array(idx[pos] - first)).to_pylist()
            except (pa.ArrowException, OSError) as e:
                err = DataError(f"cannot read row group {int(g)}: {e}", path=self.path, shard=self.shard,
                                sample=int(idx[pos[0]]))
                if on_error != "skip":
                    raise err from e
                rows = [{"__error__": str(DataError(err.reason, path=self.path, shard=self.shard, sample=int(i)))}
                        for i in idx[pos]]
            for p, row in zip(pos.tolist(), rows):
                out[p] = row
        return out  # type: ignore[return-value]

    def first_keys(self) -> list[str]:
        """Column names of the file's schema, for ``inspect``."""
        return list(self.schema_columns)

    def check(self, size: int | None = None) -> list[str]:
        """Footer check for ``zephon inspect`` ([] when nothing is wrong): the row groups' counts add up to the
        file's row count, each has every schema column, and every column chunk lies before the footer.

        size: the file's size in bytes (None: chunk ranges not checked). Reads no row data (a deep check
        decodes every row group).
        """
        meta, out = self._file.metadata, []
        counts = [meta.row_group(g).num_rows for g in range(meta.num_row_groups)]
        if sum(counts) != meta.num_rows:
            out.append(f"footer: num_rows says {meta.num_rows:,} rows, its {len(counts)} row groups hold "
                       f"{sum(counts):,}")
        data_end = None if size is None else size - 8 - meta.serialized_size  # footer + length + magic
        for g in range(meta.num_row_groups):
            rg = meta.row_group(g)
            if rg.num_columns != meta.num_columns:
                out.append(f"row group {g}: {rg.num_columns} column chunks, the schema has {meta.num_columns} columns")
            for c in range(rg.num_columns):
                col = rg.column(c)
                start = col.data_page_offset
                if col.has_dictionary_page and col.dictionary_page_offset:
                    start = min(start, col.dictionary_page_offset)
                end = start + col.total_compressed_size
                if start < 4 or (data_end is not None and end > data_end):
                    area = f"[4, {data_end:,}) of the {size:,}-byte file" if data_end is not None else "of the file"
                    out.append(f"row group {g}, column {col.path_in_schema!r}: bytes [{start:,}, {end:,}) outside "
                               f"the data area {area} (the footer does not describe this file)")
                    break
        return out

    def _row_group(self, g: int) -> pa.Table:
        with self._lock:
            table = self._groups.get(g)
            if table is not None:
                self._groups.move_to_end(g)
                return table
            table = self._file.read_row_group(g, columns=self.columns)
            self._groups[g] = table
            while len(self._groups) > ROW_GROUP_CACHE:
                self._groups.popitem(last=False)
            return table

    def close(self) -> None:
        """Close the file and drop cached row groups."""
        with self._lock:
            self._groups.clear()
            self._file.close()
