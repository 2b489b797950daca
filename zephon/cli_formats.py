"""Format options of the ``zephon`` command (``verify``, ``inspect``): the flags, and the ``open_dataset``
keywords they become for the format of each path (docs/energon.md, docs/remote.md for the formats' own); the number
flags' parsers."""
from __future__ import annotations

import argparse

FORMAT_CHOICES = ["jsonl", "parquet", "mds", "energon"]


def numbers(text: str, kind, flag: str) -> list:
    """``text``, comma-separated, as a list of ``kind`` (e.g. ``--weights``). Raises ``ValueError`` naming ``flag``."""
    try:
        return [kind(x) for x in text.split(",")]
    except ValueError:
        raise ValueError(f"{flag} takes comma-separated numbers, got {text!r}") from None


def positive(text: str) -> int:
    """An argparse type: an int >= 1."""
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def add_format_args(p: argparse.ArgumentParser) -> None:
    """Add the dataset-format flags to ``p`` (each one is passed only to the format that owns it)."""
    g = p.add_argument_group("dataset format (each flag applies to the formats named)")
    g.add_argument("--format", default=None, choices=FORMAT_CHOICES,
                   help="default: detected (MDS: a folder with index.json; Energon: a root with .nv-meta/), else "
                        "JSONL/Parquet by file extension")
    g.add_argument("--split", default=None,
                   help="MDS: the split directory under the root (<root>/<split>/index.json); "
                        "Energon: the split part (default train)")
    g.add_argument("--part-filter", default=None,
                   help="Energon: comma-separated parts to read (e.g. txt,json), 'all' for every part "
                        "(default: Energon's, the parts the field_map uses)")
    g.add_argument("--validate-hash", default=None, help="MDS: check each shard against this index.json hash "
                                                         "(e.g. sha1, xxh64)")
    g.add_argument("--allow-unsafe-types", action="store_true",
                   help="MDS: decode pkl columns; Energon: pickle parts (both run arbitrary code)")
    g.add_argument("--cache-dir", default=None, help="where index caches and decompressed shards go "
                                                     "(default $ZEPHON_CACHE_DIR or ~/.cache/zephon)")
    g.add_argument("--local", action="append", default=None,
                   help="s3:// / gs:// / msc:// sources: the local cache directory; repeat once per --data (in "
                        "order), or give one for all: each --data then gets its own sub-folder of it")
    g.add_argument("--download-retry", type=int, default=None, help="object storage: re-attempts per request")
    g.add_argument("--download-timeout", type=float, default=None, help="object storage: seconds per attempt")
    g.add_argument("--cache-limit", default=None, help="object storage: bytes the cache may hold (e.g. 10gb)")


def source_format(args, source: str) -> str | None:
    """The format ``source`` will be opened as: ``--format``, else detected (None: JSONL/Parquet files)."""
    from .formats.registry import detect_format
    from .formats.remote import detection_fetcher

    fmt = getattr(args, "format", None)
    return fmt if fmt is not None else detect_format(source, fetcher=detection_fetcher(vars(args)))


def local_for(args, index: int) -> str | None:
    """The cache folder of the ``index``-th dataset (``--data``, or ``path`` for ``inspect``): its own ``--local``
    when one is given per dataset; ``<local>/<hash of the source>`` when one ``--local`` serves several (a cache
    folder holds one remote source, docs/remote.md); None without ``--local``. Raises SystemExit for a count
    that fits neither."""
    import os

    from .formats.remote import cache_key
    given = getattr(args, "local", None)
    if not given:
        return None
    if isinstance(given, str):
        given = [given]
    sources = getattr(args, "data", None) or [getattr(args, "path", None)]
    if len(given) == len(sources):
        return given[index]
    if len(given) == 1:
        return os.path.join(given[0], cache_key(str(sources[index])))
    raise SystemExit(f"error: {len(given)} --local for {len(sources)} datasets: give one per --data, or one for all")


def open_keywords(args, source: str, index: int = 0) -> tuple[str | None, dict]:
    """``(format, open_dataset keywords)`` for ``source`` (the ``index``-th dataset) from the flags the user gave.

    ``--split`` becomes ``split_part`` for an Energon root and ``split`` otherwise (MDS); a flag of another
    format is passed on, so ``open_dataset`` refuses it with a message naming the format that takes it.
    """
    fmt = source_format(args, source)
    kw: dict = {"format": getattr(args, "format", None)}
    split = getattr(args, "split", None)
    if split is not None:
        kw["split_part" if fmt == "energon" else "split"] = split
    pf = getattr(args, "part_filter", None)
    if pf is not None:
        kw["part_filter"] = None if pf == "all" else [x for x in pf.split(",") if x]
    for name in ("validate_hash", "cache_dir", "download_retry", "download_timeout", "cache_limit"):
        if getattr(args, name, None) is not None:
            kw[name] = getattr(args, name)
    local = local_for(args, index)
    if local is not None:
        kw["local"] = local
    if getattr(args, "allow_unsafe_types", False):
        kw["allow_unsafe_types"] = True
    return fmt, kw


def unopenable(source: str, kw: dict, err) -> list[str] | None:
    """``zephon inspect`` on a dataset that does not open: one line per bad file, or None when ``err`` is not
    about the data (a path that does not exist, a bad flag: a usage error).

    source, kw: what ``open_dataset`` was given. err: its ``DataError``. A local JSONL / Parquet dataset's files
    are then opened one at a time, so every bad file is named, not only the first; other datasets (MDS,
    Energon, object storage) are one index, named by ``err``."""
    from .formats import DataError, open_dataset
    from .formats.discovery import expand_source

    if err.shard is None:
        return None  # not about a shard of the dataset (a missing path, nothing to read, a split it lacks)
    try:
        files = expand_source(source, kw.get("format")) if kw.get("format") in (None, "jsonl", "parquet") else []
    except (DataError, OSError):
        files = []
    bad = []
    for path, fmt in files:
        try:
            open_dataset(path, **dict(kw, format=fmt))
        except DataError as e:
            bad.append(f"{e.path or path}: {e.reason}")
    return bad or [str(err)]
