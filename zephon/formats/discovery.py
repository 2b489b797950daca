"""Turn a user's ``source`` (directory, glob, file, or a list of those) into an ordered file list."""
from __future__ import annotations

import glob
import os
from typing import Iterable

from .codecs import FILE_EXTENSIONS
from .errors import DataError

# Extension -> format. Compressed JSON Lines keep the inner extension (a.jsonl.gz, a.jsonl.zst).
_JSONL_BASES = (".jsonl", ".json", ".ndjson")
EXTENSIONS: dict[str, str] = {b + c: "jsonl" for b in _JSONL_BASES for c in ("",) + FILE_EXTENSIONS}
EXTENSIONS.update({".parquet": "parquet", ".pq": "parquet"})
FORMATS = ("jsonl", "parquet")


def format_of(path: str) -> str | None:
    """``"jsonl"`` or ``"parquet"`` from the file name's extension (case-insensitive), else None."""
    lower = path.lower()
    for ext in sorted(EXTENSIONS, key=len, reverse=True):  # longest first: .jsonl.gz before .gz
        if lower.endswith(ext):
            return EXTENSIONS[ext]
    return None


def _is_hidden(rel: str) -> bool:
    return any(part.startswith(".") for part in rel.split(os.sep))


_SHOWN = 5  # file names quoted in a "nothing to read here" message


def nothing_to_read(fmt: str | None, where: str, names: list[str]) -> str:
    """The reason for a directory or prefix without files to read: what it holds and what each format needs.

    fmt: the forced format or None. where: "directory" | "prefix". names: the (non-hidden) file names
    found there, relative to it. Names MDS shards (``*.mds[.zstd]``) and tars seen, since those mean an
    ``index.json`` or ``.nv-meta/`` is missing rather than a wrong path.
    """
    kinds = fmt or "supported"
    exts = ", ".join(sorted(EXTENSIONS if fmt is None else (e for e, f in EXTENSIONS.items() if f == fmt)))
    if not names:
        found = "it holds no files"
    else:
        shown = ", ".join(sorted(names)[:_SHOWN]) + (", ..." if len(names) > _SHOWN else "")
        found = f"found {len(names)} file{'s' * (len(names) != 1)} ({shown}), none read as {fmt or 'JSONL/Parquet'}"
    msg = f"no {kinds} files in {where}: {found} (JSONL/Parquet are taken by extension: {exts})."
    base = [n.rsplit("/", 1)[-1].lower() for n in names]
    if any(".mds" in b for b in base):
        msg += (" These look like MDS shards: an MDS dataset is read from the directory holding its index.json "
                "(written by streaming.MDSWriter), which is missing here; copy it back or pass the directory "
                "that has it.")
    if any(b.endswith(".tar") for b in base):
        msg += (" These look like WebDataset tars: an Energon dataset needs .nv-meta/ and a .tar.idx per tar; run "
                "`energon prepare <this directory>` (megatron-energon) first.")
    if not any(".mds" in b or b.endswith(".tar") for b in base):
        msg += " (An MDS dataset needs index.json in the directory; an Energon dataset needs .nv-meta/.)"
    return msg


def _scan_dir(d: str, fmt: str | None) -> list[str]:
    # Sorted by path relative to d so the order does not depend on the file system. Hidden files and
    # directories are skipped (index caches live there); symlinked directories are not followed.
    found, others = [], []
    for root, _dirs, files in os.walk(d):
        for f in files:
            full = os.path.join(root, f)
            rel = os.path.relpath(full, d)
            if _is_hidden(rel):
                continue
            ff = format_of(f)
            if ff is not None and (fmt is None or ff == fmt):
                found.append((rel.replace(os.sep, "/"), full))
            else:
                others.append(rel.replace(os.sep, "/"))
    if not found:
        raise DataError(nothing_to_read(fmt, "directory", others), path=d)
    return [full for _, full in sorted(found)]


def _has_magic(s: str) -> bool:
    return any(c in s for c in "*?[")


def _pattern_takes(ff: str | None, fmt: str | None) -> bool:
    """Whether a file a pattern matched is taken.

    ff: the file's format by extension (None: unknown). fmt: the forced format, or None.
    """
    # The user wrote the pattern: with a forced format take any file not known to be
    # another format (e.g. *.txt as jsonl); without one take only known extensions.
    return (ff is not None and fmt is None) or (fmt is not None and ff in (None, fmt))


def _expand_glob(pattern: str, fmt: str | None) -> list[str]:
    """Files matching a local glob ``pattern`` (``**`` allowed), sorted; directories skipped.

    pattern: the glob. fmt: the forced format, or None. Raises DataError when no file is taken.
    """
    matched = [m for m in sorted(glob.glob(pattern, recursive=True))
               if not os.path.isdir(m) and _pattern_takes(format_of(m), fmt)]
    if not matched:
        raise DataError("no supported files matched this pattern", path=pattern)
    return matched


def expand_source(source, fmt: str | None = None) -> list[tuple[str, str]]:
    """Files of ``source`` in order, as ``[(absolute_path, format), ...]``.

    source: a directory (every supported file under it, recursively, sorted by relative path), a glob
    pattern (``**`` allowed; matches sorted; files of unknown type skipped unless fmt is given), a file path, or a list
    of those (concatenated in list order). fmt: force a format ("jsonl"/"parquet") instead of going
    by extension; in directories and globs it also selects which files are taken.
    Raises DataError when nothing matches, a listed file has an unknown extension, or a file is listed twice.
    """
    items: Iterable = source if isinstance(source, (list, tuple)) else [source]
    files: list[str] = []
    for item in items:
        s = os.fspath(item)
        if os.path.isdir(s):
            files.extend(_scan_dir(s, fmt))
        elif os.path.isfile(s):
            files.append(s)
        elif _has_magic(s):
            files.extend(_expand_glob(s, fmt))
        else:
            raise DataError("no such file or directory", path=s)
    out, seen = [], set()
    for f in files:
        ap = os.path.abspath(f)
        if ap in seen:
            raise DataError("file listed twice in the source", path=ap)
        seen.add(ap)
        ff = fmt or format_of(ap)
        if ff is None:
            raise DataError(f"unknown file type; pass format= (extensions: {', '.join(sorted(EXTENSIONS))})", path=ap)
        out.append((ap, ff))
    if not out:
        raise DataError(f"no files matched source {source!r}")
    return out


def expand_remote(item: str, fmt: str | None, fetcher) -> tuple[str, list]:
    """Objects of one remote ``item`` in order: ``(prefix URL, [(ObjectInfo, format), ...])``.

    item: an object URL (by extension, or any with ``fmt``), a glob pattern (``**`` allowed), or a prefix
    read as a directory (every supported object below it, sorted by key; hidden names skipped). fetcher: a
    ``remote.Fetcher``. The prefix is the directory the objects' cache paths are relative to.
    Raises DataError when nothing matches; RemoteError (naming the URL) when the store cannot be read.
    """
    from .remote import basename, glob_match, glob_prefix, has_magic, relative
    if has_magic(item):
        prefix = glob_prefix(item)
        found = []
        for o in fetcher.list(prefix):
            ff = format_of(o.url)
            wanted = _pattern_takes(ff, fmt)
            hidden = _is_hidden(relative(o.url, prefix).replace("/", os.sep))  # as glob.glob: * skips dot names
            if wanted and not hidden and glob_match(o.url, item):
                found.append((o, fmt or ff))
        if not found:
            raise DataError("no supported objects matched this pattern", path=item)
        return prefix, found
    if format_of(item) is not None or (fmt is not None and not item.endswith("/")):
        from .remote import ObjectMissing
        try:
            return item.rsplit("/", 1)[0], [(fetcher.head(item), fmt or format_of(item))]
        except ObjectMissing:
            if format_of(item) is not None:
                raise
        # forced format on a name without extension that is no object: a prefix after all
    found, others = [], []
    for o in fetcher.list(item):
        rel = relative(o.url, item)
        if _is_hidden(rel.replace("/", os.sep)) or basename(o.url) == "":
            continue
        ff = format_of(o.url)
        if ff is not None and (fmt is None or ff == fmt):
            found.append((o, ff))
        else:
            others.append(rel)
    if not found:
        raise DataError(nothing_to_read(fmt, "prefix", others).replace(" files in prefix", " objects under this "
                                                                        "prefix", 1), path=item)
    return item.rstrip("/"), found
