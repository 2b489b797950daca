"""Integrity check of a dataset's shards against their indexes: what ``zephon inspect`` reports.

Per shard, cheaply (no sample data beyond a first and last record):

- MDS: the file's size against ``index.json`` (``raw_data`` / ``zip_data`` bytes), the header's sample count
  and offsets against the index and the file (``mds.integrity.shard_problems``);
- JSONL: the file opens (a compressed stream decompresses whole), the line index covers the file, the first
  and last records parse (``JsonlReader.check``);
- Parquet: the footer's row count and row groups, column chunks inside the file (``ParquetReader.check``);
- Energon: the tar against its ``.tar.idx`` and ``.nv-meta`` counts, first and last samples parse with their
  indexed keys (``energon.check.tar_problems``).

``deep=True`` also reads (decodes) every sample and names the first bad one per shard (with ``field``, also a
sample whose field is missing or not text, as ``Decode`` would refuse it). A shard that cannot be
opened at all is reported with the reason, never raised, so one run names every bad shard.
"""
from __future__ import annotations

import os
from dataclasses import asdict, dataclass, field
from typing import Callable

from .base import BrokenShard, Dataset
from .errors import DataError
from .records import FieldError, field_text
from .remote import AccessDenied, CacheFull, RemoteError, RemoteUnreachable

# the store could not be read (network, server, credentials): the shard is not checked, not bad
UNREACHABLE = (RemoteUnreachable, AccessDenied)

DEEP_BATCH = 256  # samples read per call in a deep check


@dataclass
class ShardReport:
    """The check of one shard.

    shard / path / format / num_samples / size_bytes: as the dataset lists it. columns: the shard's column
    names (record keys) when it opened. problems: what is wrong, each saying what the index expected and what
    was found ([] = fine). samples_read: samples a deep check read. bad_samples: how many of those failed;
    first_bad_sample / first_bad_error: the first (its index in the shard and the full error message).
    unreachable: why the shard could not be checked (the object URL and the network or server error), None
    when it was read; such a shard is neither ok nor bad.
    """
    shard: int
    path: str
    format: str
    num_samples: int
    size_bytes: int
    columns: list = field(default_factory=list)
    problems: list = field(default_factory=list)
    samples_read: int = 0
    bad_samples: int = 0
    first_bad_sample: int | None = None
    first_bad_error: str | None = None
    unreachable: str | None = None

    @property
    def bad(self) -> bool:
        return bool(self.problems or self.bad_samples)

    @property
    def ok(self) -> bool:
        return not self.bad and self.unreachable is None

    def as_dict(self) -> dict:
        return {**asdict(self), "ok": self.ok}


def _is_remote(ds: Dataset, shard_id: int) -> bool:
    remote = getattr(ds, "remote", None)
    if isinstance(remote, list):  # FileDataset: per shard
        return remote[shard_id] is not None
    return remote is not None


def _local_size(ds: Dataset, shard_id: int) -> int | None:
    """The shard file's size on disk now (None for an object read from a bucket)."""
    return None if _is_remote(ds, shard_id) else os.stat(ds.shards[shard_id].path).st_size


def _mds_file(ds, shard_id: int) -> list[str]:
    """The MDS shard file's size against index.json (before opening: a cut compressed file fails to open)."""
    from .mds.integrity import size_problem

    meta, path = ds.metas[shard_id], ds.shards[shard_id].path
    size = _local_size(ds, shard_id)
    if size is None:
        return []  # a remote object is checked by size when fetched
    entry, field = (meta.zip, "zip_data") if meta.zip is not None and path == meta.zip_path else (meta.raw,
                                                                                                   "raw_data")
    problem = size_problem(field, entry.bytes, size)
    return [problem] if problem else []


def _mds(ds, shard_id: int, reader) -> list[str]:
    from .mds.integrity import shard_problems

    return shard_problems(compressed=reader.read_path != reader.path, read_size=reader.file_size,
                          raw_bytes=ds.metas[shard_id].raw.bytes, offsets=reader.offsets, readable=reader._ok)


def _jsonl(ds, shard_id: int, reader) -> list[str]:
    return reader.check(_local_size(ds, shard_id))


def _parquet(ds, shard_id: int, reader) -> list[str]:
    size = _local_size(ds, shard_id)
    return reader.check(ds.shards[shard_id].size_bytes if size is None else size)


def _energon(ds, shard_id: int, reader) -> list[str]:
    from .energon.check import tar_problems

    size = _local_size(ds, shard_id)
    return tar_problems(reader, ds.shards[shard_id].size_bytes if size is None else size)


# format name -> cheap check of an opened reader: (dataset, shard id, reader) -> problems
CHECKS: dict[str, Callable[..., list]] = {"mds": _mds, "jsonl": _jsonl, "parquet": _parquet, "energon": _energon}
# format name -> check of the shard's files before a reader is opened: (dataset, shard id) -> problems
FILE_CHECKS: dict[str, Callable[..., list]] = {"mds": _mds_file}


def _field_error(reader, rep: ShardReport, i: int, record: dict, field: str | None) -> str | None:
    """The error a ``Decode(field)`` would raise for ``record`` (sample ``i``), naming file, shard, sample (and
    line for JSONL); None when the field is text (or no field is checked)."""
    if field is None:
        return None
    try:
        field_text(record, field)
        return None
    except FieldError as e:
        locate = getattr(reader, "locate", None)
        line = locate(i).get("line") if locate is not None else None
        return str(DataError(str(e), path=rep.path, shard=rep.shard, sample=i, line=line))


def _read_all(reader, rep: ShardReport, progress: Callable[[int], object] | None, field: str | None) -> None:
    n = reader.num_samples
    for lo in range(0, n, DEEP_BATCH):
        idx = list(range(lo, min(n, lo + DEEP_BATCH)))
        try:
            recs = reader.read(idx, on_error="skip")
            errors = [(i, r["__error__"] if "__error__" in r else _field_error(reader, rep, i, r, field))
                      for i, r in zip(idx, recs)]
            errors = [(i, e) for i, e in errors if e is not None]
        except DataError as e:  # the whole batch failed (e.g. the file is shorter than its index)
            first = e.sample if e.sample is not None else idx[0]
            errors = [(i, str(e.located(sample=i)) if i == first else None) for i in idx if i >= first]
        if errors:
            rep.bad_samples += len(errors)
            if rep.first_bad_sample is None:
                rep.first_bad_sample, rep.first_bad_error = errors[0]
        rep.samples_read += len(idx)
        if progress is not None:
            progress(len(idx))


def check_shard(ds: Dataset, shard_id: int, *, deep: bool = False,
                progress: Callable[[int], object] | None = None, field: str | None = None) -> ShardReport:
    """Check shard ``shard_id`` of ``ds`` with a fresh reader (never the dataset's cached one).

    deep: also read every sample (``DEEP_BATCH`` at a time). progress: called with the number of samples read
    after each batch of a deep check. field: with ``deep``, every sample must hold this field as text (what
    ``Decode(field)`` takes; None: not checked). Returns a ``ShardReport``; bad data never raises, nor does a
    store that does not answer (``ShardReport.unreachable``). Raises CacheFull when ``cache_limit`` leaves no
    room for the shard (a setting to change, the same for every shard).
    """
    info = ds.shards[shard_id]
    try:
        return _check(ds, shard_id, deep, progress, field)
    except UNREACHABLE as e:
        rep = ShardReport(shard_id, info.path, info.format, info.num_samples, info.size_bytes, unreachable=str(e))
        if deep and progress is not None:
            progress(info.num_samples)  # the bar counts the shard as done (ahead when it failed mid-read)
        return rep


def _check(ds: Dataset, shard_id: int, deep: bool, progress, field) -> ShardReport:
    info = ds.shards[shard_id]
    rep = ShardReport(shard_id, info.path, info.format, info.num_samples, info.size_bytes)
    if info.format in FILE_CHECKS:
        rep.problems.extend(FILE_CHECKS[info.format](ds, shard_id))
    try:
        reader = ds._make_reader(shard_id)
        if isinstance(reader, BrokenShard):
            raise reader.error
    except (CacheFull, *UNREACHABLE):
        raise
    except (DataError, OSError, RemoteError) as e:  # RemoteError: e.g. an object shorter than its listing
        rep.problems.append(f"cannot be opened: {getattr(e, 'reason', None) or e}")
        if deep and progress is not None:
            progress(info.num_samples)
        return rep
    try:
        if reader.num_samples != info.num_samples:
            rep.problems.append(f"count: the dataset lists {info.num_samples:,} samples, the shard has "
                                f"{reader.num_samples:,}")
        check = CHECKS.get(info.format)
        if check is not None:
            rep.problems.extend(check(ds, shard_id, reader))
        try:
            rep.columns = list(reader.first_keys()) if reader.num_samples else []
        except DataError:
            pass  # the first record does not parse: the check above says so
        if deep:
            _read_all(reader, rep, progress, field)
    finally:
        close = getattr(reader, "close", None)
        if close is not None:
            close()
    return rep


def summary(ds: Dataset, reports: list[ShardReport], deep: bool) -> dict:
    """``zephon inspect --json``: ``{"name", "format" (one format or "mixed"), "num_shards", "num_samples",
    "columns" (those every non-empty, opened shard has), "deep", "ok", "bad_shards": [paths],
    "unreachable_shards": ["<object URL>: <error>"] (not checked: the store did not answer),
    "shards": [ShardReport.as_dict(), ...]}``."""
    from .registry import describe

    return {**describe(ds, [r.columns for r in reports]), "deep": deep, "ok": all(r.ok for r in reports),
            "bad_shards": [r.path for r in reports if r.bad],
            "unreachable_shards": [r.unreachable for r in reports if r.unreachable is not None],
            "shards": [r.as_dict() for r in reports]}


def check_source(source, *, deep: bool = False, progress: Callable[[int], object] | None = None,
                 field: str | None = None, **kw) -> dict:
    """Open ``source`` (``kw`` as for ``open_dataset``, on_error forced to "raise") and check every shard
    (``field``: as for ``check_shard``).

    Returns ``summary(...)``. Raises like ``open_dataset`` when the dataset itself cannot be opened (no index,
    bad index.json, a shard file missing); problems of opened shards are reported, not raised.
    """
    from .registry import open_dataset

    ds = open_dataset(source, **{**kw, "on_error": "raise"})
    reports = [check_shard(ds, i, deep=deep, progress=progress, field=field) for i in range(len(ds.shards))]
    return summary(ds, reports, deep)
