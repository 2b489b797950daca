"""Mosaic MDS datasets: shards and ``index.json`` as written by ``streaming.MDSWriter`` (mosaicml-streaming 0.13).

This is an independent reader of the on-disk format; ``streaming`` is never imported (it is only used by
the tests, as the reference). Records decode to the same values and types as ``streaming.StreamingDataset``.

MDS shard layout as written by streaming.MDSWriter 0.13
--------------------------------------------------------
A dataset directory (or ``<root>/<split>/``) holds ``index.json``::

    {"version": 2, "shards": [{"format": "mds", "version": 2, "samples": n,
        "column_names": [...sorted...], "column_encodings": [...], "column_sizes": [int | null, ...],
        "compression": null | "zstd" | "zstd:7" | "gz" | "bz2" | "br" | "snappy" (optionally ":level"),
        "hashes": ["sha1", "xxh64", ...], "size_limit": int | null,
        "raw_data": {"basename": "shard.00000.mds", "bytes": int, "hashes": {algo: hexdigest}},
        "zip_data": null | {"basename": "shard.00000.mds.zstd", "bytes": int, "hashes": {...}}}, ...]}

A raw shard file (all integers uint32 little endian)::

    [n: 4 bytes] [offsets: (n + 1) * 4 bytes] [writer config JSON] [sample 0] ... [sample n-1]

where sample ``i`` is the bytes ``[offsets[i], offsets[i+1])`` of the file (absolute positions, so a shard
is at most 4 GiB) and ``offsets[n]`` is the file size. A sample is ``[size of each variable-size column:
4 bytes each, in column order] [column 0] [column 1] ...``; a column with a fixed size (``column_sizes[c]``
not null) has no size entry. A compressed shard is the whole raw file compressed as one stream
(``zip_data``); the writer keeps only the compressed file.

Column encodings (bytes of one column -> Python value, as ``streaming`` returns it):

- ``bytes`` -> ``bytes``; ``str`` -> ``str`` (UTF-8); ``json`` -> ``json.loads`` of UTF-8 text
- ``int`` -> ``int`` (8 bytes, int64); ``uint8`` .. ``uint64``, ``int8`` .. ``int64``, ``float16``,
  ``float32``, ``float64`` -> the numpy scalar type (e.g. ``numpy.uint8``)
- ``str_int`` -> ``int``, ``str_float`` -> ``float``, ``str_decimal`` -> ``decimal.Decimal`` (decimal text)
- ``ndarray`` (dtype and shape stored per sample), ``ndarray:<dtype>`` (shape per sample),
  ``ndarray:<dtype>:<d0>,<d1>,...`` (fixed size) -> a read-only ``numpy.ndarray``. Per-sample header:
  ``[dtype code: 1 byte]`` when the dtype is not fixed, then, when the shape is not fixed,
  ``[ndim << 2 | shape width code: 1 byte] [shape: ndim unsigned ints of 1/2/4/8 bytes]``, then the values.
- ``pil`` -> ``PIL.Image.Image`` from ``[width: 4] [height: 4] [len(mode): 4] [mode] [raw pixels]``;
  ``jpeg`` / ``png`` -> the image opened with ``PIL.Image.open`` (loaded, so bad data fails here)
- ``list[pil]`` / ``list[jpeg]`` / ``list[png]`` -> ``list`` of images:
  ``[reserved: 4] [count: 4] [sizes: count * 4] [elements]``
- ``jpeg_array`` (alias ``jpegarray``) -> ``list`` of JPEG images: ``[count: 4] [sizes: count * 4] [JPEGs]``;
  a count of 0 is refused, as ``streaming`` does
- ``pkl`` -> ``pickle.loads`` (runs arbitrary code): refused unless ``allow_unsafe_types=True`` (or
  ``columns`` leaves the column out: it is then never decoded)

Reading
-------
``open_mds`` (reached through ``open_dataset(path, format="mds")``, or automatically when the directory
holds a streaming ``index.json``) parses the index and stats every shard file; it reads no shard data.
A shard is opened on its first read:

1. with ``validate_hash``, the file read is hashed (once per process per file; the compressed file
   against ``zip_data.hashes``, a raw file or decompressed copy against ``raw_data.hashes``);
2. a compressed shard without its raw file next to it (``streaming`` leaves one there after reading)
   is decompressed once into ``<cache_dir>/mds/`` (atomic write: temporary file + rename; reused by later
   opens and other processes; never evicted: delete that directory to reclaim the space; held in memory
   when the cache cannot be written);
3. the header is read: ``4 + 4 * (n + 1)`` bytes (count + offsets), nothing else.

Records are then read with ``os.pread`` (no shared file position: a reader is shared by threads), only
the bytes of the requested samples (neighbouring samples coalesced into one read of at most 16 MiB),
and only the requested columns are decoded.

Bad input raises ``DataError`` naming the file, shard and sample: a bad ``index.json`` (at open time,
always), a missing shard file (at open time, always), a truncated shard or offsets out of range, a
header that disagrees with ``index.json``, corrupt compressed data, a hash mismatch, a column that does
not decode. With ``on_error="skip"`` a bad sample reads as ``{"__error__": message}`` and a shard that
cannot be opened at all gives that for each of its samples (counted and reported by the loader).
"""
from __future__ import annotations

import bz2
import decimal
import gzip
import hashlib
import io
import json
import os
import pickle
import tempfile
import threading
import zlib
from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np

from .base import Dataset, ShardInfo
from .errors import DataError, per_sample
from .fileio import PreadFile, coalesce_runs
from .index_cache import default_cache_dir

INDEX_BASENAME = "index.json"
FORMAT = "mds"
_HASH_BLOCK = 4 << 20      # bytes read per step when hashing or decompressing a file

# Compression families MDSWriter offers and the levels it accepts after "name:".
COMPRESSION_LEVELS = {"br": range(12), "bz2": range(1, 10), "gz": range(10), "snappy": (), "zstd": range(1, 23)}
XXHASH_ALGORITHMS = ("xxh32", "xxh64", "xxh128", "xxh3_64", "xxh3_128")
UNSAFE_ENCODINGS = ("pkl",)

_SCALARS = {"uint8": "<u1", "uint16": "<u2", "uint32": "<u4", "uint64": "<u8", "int8": "<i1", "int16": "<i2",
            "int32": "<i4", "int64": "<i8", "float16": "<f2", "float32": "<f4", "float64": "<f8"}
_NDARRAY_DTYPE_CODES = {8: "uint8", 9: "int8", 16: "uint16", 17: "int16", 18: "float16", 32: "uint32",
                        33: "int32", 34: "float32", 64: "uint64", 65: "int64", 66: "float64"}
_NDARRAY_DTYPES = set(_NDARRAY_DTYPE_CODES.values())
_SHAPE_WIDTHS = {0: "<u1", 1: "<u2", 2: "<u4", 3: "<u8"}


# ------------------------------------------------------------------------------------------ index


@dataclass(frozen=True)
class FileEntry:
    """``raw_data`` / ``zip_data`` of an index entry: basename, size in bytes, ``{algorithm: hexdigest}``."""
    basename: str
    bytes: int
    hashes: dict


@dataclass(frozen=True)
class ShardMeta:
    """One shard of ``index.json`` (validated): everything needed to open and decode it.

    index_path: absolute path of the index.json naming it. column_sizes: fixed byte size per column, or
    None for variable-size columns. compression: e.g. "zstd:7" or None. zip: None when uncompressed.
    """
    index_path: str
    column_names: tuple
    column_encodings: tuple
    column_sizes: tuple
    compression: str | None
    samples: int
    raw: FileEntry
    zip: FileEntry | None

    @property
    def dirname(self) -> str:
        return os.path.dirname(self.index_path)

    @property
    def raw_path(self) -> str:
        return os.path.join(self.dirname, self.raw.basename)

    @property
    def zip_path(self) -> str | None:
        return os.path.join(self.dirname, self.zip.basename) if self.zip else None


def _file_entry(obj, what: str) -> FileEntry:
    if not isinstance(obj, dict):
        raise ValueError(f"{what} must be an object, got {type(obj).__name__}")
    base, size, hashes = obj.get("basename"), obj.get("bytes"), obj.get("hashes", {})
    if not isinstance(base, str) or not base or base in (".", "..") or "/" in base or "\\" in base:
        raise ValueError(f"{what}.basename must be a plain file name, got {base!r}")
    if not isinstance(size, int) or isinstance(size, bool) or size < 0:
        raise ValueError(f"{what}.bytes must be an int >= 0, got {size!r}")
    if hashes is None:
        hashes = {}
    if not isinstance(hashes, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in hashes.items()):
        raise ValueError(f"{what}.hashes must map algorithm names to hex digests, got {hashes!r}")
    return FileEntry(base, size, dict(hashes))


def _check_compression(algo) -> None:
    if algo is None:
        return
    if not isinstance(algo, str):
        raise ValueError(f"compression must be a string or null, got {algo!r}")
    family, _, level = algo.partition(":")
    if family not in COMPRESSION_LEVELS:
        raise ValueError(f"unknown compression {algo!r} (MDS offers: {', '.join(sorted(COMPRESSION_LEVELS))}, "
                         f"optionally with ':level')")
    if level and not (level.isdigit() and int(level) in COMPRESSION_LEVELS[family]):
        raise ValueError(f"compression {algo!r}: bad level for {family}")


def parse_index(index_path: str, allow_unsafe_types: bool = False,
                columns: Sequence[str] | None = None) -> list[ShardMeta]:
    """Shards of an MDS ``index.json``, validated.

    Raises DataError naming the index file (and the shard) for unreadable/invalid JSON, a version other
    than 2, a non-MDS shard format, missing or ill-typed fields, an unknown column encoding or
    compression, column sizes that contradict the encodings, and (unless ``allow_unsafe_types``) a
    ``pkl`` column that would be decoded (any, or one of ``columns`` when given), naming the column
    and the flag.
    """
    try:
        with open(index_path, "rb") as f:
            obj = json.loads(f.read())
    except OSError as e:
        raise DataError(f"cannot read index: {e.strerror or e}", path=index_path) from None
    except (ValueError, UnicodeDecodeError, RecursionError) as e:
        raise DataError(f"bad index.json: not valid JSON ({e})", path=index_path) from None
    if not isinstance(obj, dict) or not isinstance(obj.get("shards"), list):
        raise DataError("bad index.json: expected an object with a 'shards' list", path=index_path)
    if obj.get("version") != 2:
        raise DataError(f"bad index.json: version {obj.get('version')!r} (MDS index version 2 expected)",
                        path=index_path)
    metas = []
    for i, s in enumerate(obj["shards"]):
        try:
            metas.append(_parse_shard(index_path, s))
        except (ValueError, TypeError, KeyError) as e:
            raise DataError(f"bad index.json entry: {e}", path=index_path, shard=i) from None
        if not allow_unsafe_types:
            for name, enc in zip(metas[-1].column_names, metas[-1].column_encodings):
                if enc in UNSAFE_ENCODINGS and (columns is None or name in columns):
                    raise DataError(f"column {name!r} uses the unsafe encoding {enc!r} (unpickling runs arbitrary "
                                    f"code); pass allow_unsafe_types=True to open_dataset if you trust this data",
                                    path=index_path, shard=i)
    return metas


def _parse_shard(index_path: str, s) -> ShardMeta:
    if not isinstance(s, dict):
        raise ValueError(f"expected an object, got {type(s).__name__}")
    if s.get("format") != FORMAT:
        raise ValueError(f"shard format {s.get('format')!r} is not supported (only 'mds' shards are read)")
    if s.get("version", 2) != 2:
        raise ValueError(f"shard version {s.get('version')!r} (2 expected)")
    names, encs, sizes = s.get("column_names"), s.get("column_encodings"), s.get("column_sizes")
    if not (isinstance(names, list) and isinstance(encs, list) and isinstance(sizes, list)):
        raise ValueError("column_names, column_encodings and column_sizes must be lists")
    if not len(names) == len(encs) == len(sizes):
        raise ValueError(f"{len(names)} column_names, {len(encs)} column_encodings, {len(sizes)} column_sizes")
    if not all(isinstance(n, str) for n in names) or len(set(names)) != len(names):
        raise ValueError(f"column_names must be distinct strings, got {names!r}")
    for name, enc, size in zip(names, encs, sizes):
        if not isinstance(enc, str):
            raise ValueError(f"column {name!r}: encoding must be a string, got {enc!r}")
        try:
            _, fixed = column_codec(enc)
        except ValueError as e:
            raise ValueError(f"column {name!r}: {e}") from None
        if size != fixed or isinstance(size, bool):
            raise ValueError(f"column {name!r}: column_sizes says {size!r}, encoding {enc!r} has "
                             f"{'a fixed size of ' + str(fixed) + ' bytes' if fixed is not None else 'no fixed size (null)'}")
    samples = s.get("samples")
    if not isinstance(samples, int) or isinstance(samples, bool) or samples < 0:
        raise ValueError(f"samples must be an int >= 0, got {samples!r}")
    compression = s.get("compression")
    _check_compression(compression)
    raw = _file_entry(s.get("raw_data"), "raw_data")
    zip_ = s.get("zip_data")
    zip_ = _file_entry(zip_, "zip_data") if zip_ is not None else None
    if (zip_ is None) != (compression is None):
        raise ValueError(f"compression {compression!r} but zip_data is {'missing' if zip_ is None else 'present'}")
    if zip_ is not None and zip_.basename == raw.basename:
        raise ValueError("raw_data and zip_data name the same file")
    return ShardMeta(index_path, tuple(names), tuple(encs), tuple(sizes), compression, samples, raw, zip_)


def find_index(source, split: str | None = None) -> str:
    """Absolute path of the ``index.json`` of ``source`` (a dataset directory, a root with split
    directories, or an index.json file) and ``split``. Raises DataError when there is none; for a
    root whose splits hold the indexes, the message lists the splits."""
    if isinstance(source, (list, tuple)):
        raise ValueError("an MDS dataset is one directory (with its index.json); open several directories "
                         "with several open_dataset calls")
    s = os.path.abspath(os.fspath(source))
    if os.path.isfile(s):
        if split is not None:
            raise ValueError("split applies to a dataset root directory, not to an index file")
        return s
    if not os.path.isdir(s):
        raise DataError("no such file or directory", path=s)
    d = os.path.join(s, split) if split is not None else s
    index = os.path.join(d, INDEX_BASENAME)
    if os.path.isfile(index):
        return index
    if split is not None:
        have = _splits_of(s)
        raise DataError(f"no {INDEX_BASENAME} for split {split!r}"
                        + (f" (splits here: {', '.join(have)})" if have else ""), path=d)
    have = _splits_of(s)
    if have:
        raise DataError(f"no {INDEX_BASENAME} here; this root has splits {', '.join(have)}: pass split=", path=s)
    raise DataError(f"no {INDEX_BASENAME} (not an MDS dataset directory)", path=s)


def _splits_of(root: str) -> list[str]:
    try:
        names = sorted(os.listdir(root))
    except OSError:
        return []
    return [n for n in names if os.path.isfile(os.path.join(root, n, INDEX_BASENAME))]


def is_mds_source(source, split: str | None = None) -> bool:
    """Whether ``source`` looks like an MDS dataset, for format auto-detection: a ``split`` was given,
    or ``source`` is a directory holding (or an ``index.json`` file that is) a streaming index, i.e. a
    JSON object with ``version`` and a ``shards`` list. Cheap and never raises."""
    if split is not None:
        return True
    if isinstance(source, (list, tuple)):
        return False
    try:
        s = os.fspath(source)
    except TypeError:
        return False
    if os.path.isdir(s):
        path = os.path.join(s, INDEX_BASENAME)
    elif os.path.basename(s) == INDEX_BASENAME and os.path.isfile(s):
        path = s
    else:
        return False
    try:
        if os.path.getsize(path) > (256 << 20):
            return False
        with open(path, "rb") as f:
            obj = json.loads(f.read())
    except (OSError, ValueError, UnicodeDecodeError, RecursionError):
        return False
    return isinstance(obj, dict) and "version" in obj and isinstance(obj.get("shards"), list)


# ------------------------------------------------------------------------------------------ column codecs


class _Bad(ValueError):
    """A column's bytes do not decode (turned into a DataError with file, shard, sample and column)."""


def _u32(data, at: int, count: int = 1) -> np.ndarray:
    if at + 4 * count > len(data) or count < 0:
        raise _Bad(f"needs {4 * count} bytes at offset {at}, has {len(data)} bytes in all")
    return np.frombuffer(data, "<u4", count, at)


def _scalar(dtype: str) -> Callable:
    dt = np.dtype(dtype)

    def decode(data):
        return np.frombuffer(data, dt, 1)[0]
    return decode


def _int(data):
    return int.from_bytes(data, "little", signed=True)


def _text(data) -> str:
    return bytes(data).decode("utf-8")


def _json(data):
    return json.loads(_text(data))


def _decimal(data):
    try:
        return decimal.Decimal(_text(data))
    except decimal.InvalidOperation:
        raise _Bad(f"not a decimal: {bytes(data[:40])!r}") from None


def _ndarray(dtype: str | None, shape: tuple | None) -> Callable:
    def decode(data):
        at = 0
        if dtype is None:
            if len(data) < 1:
                raise _Bad("no dtype byte")
            code = data[0]
            if code not in _NDARRAY_DTYPE_CODES:
                raise _Bad(f"unknown ndarray dtype code {code}")
            dt, at = _NDARRAY_DTYPE_CODES[code], 1
        else:
            dt = dtype
        if shape is None:
            if len(data) < at + 1:
                raise _Bad("no shape byte")
            ndim, width = data[at] >> 2, data[at] & 3
            wdt = np.dtype(_SHAPE_WIDTHS[width])
            at += 1
            if len(data) < at + ndim * wdt.itemsize:
                raise _Bad(f"shape of {ndim} dims does not fit")
            shp = tuple(int(x) for x in np.frombuffer(data, wdt, ndim, at))
            at += ndim * wdt.itemsize
        else:
            shp = shape
        vdt = np.dtype(dt)
        n = (len(data) - at) // vdt.itemsize
        if n * vdt.itemsize != len(data) - at or n != int(np.prod(shp, dtype=np.int64)):
            raise _Bad(f"{len(data) - at} value bytes do not hold a {dt} array of shape {shp}")
        return np.frombuffer(data, vdt, n, at).reshape(shp)
    return decode


def _pil(data):
    from PIL import Image
    w, h, mode_len = (int(x) for x in _u32(data, 0, 3))
    if 12 + mode_len > len(data):
        raise _Bad("image mode does not fit")
    mode = _text(data[12:12 + mode_len])
    return Image.frombytes(mode, (w, h), bytes(data[12 + mode_len:]))


def _image_file(data):
    from PIL import Image
    img = Image.open(io.BytesIO(bytes(data)))
    img.load()  # decode now, so bad data is reported here (streaming leaves it to first pixel access)
    return img


def _sized_items(data, at: int, noun: str) -> list:
    """Split ``data`` holding, from byte ``at``: a u32 count n, n u32 sizes, then the n items back to back
    filling the rest. Raises _Bad (naming the items as ``noun``) when the sizes do not fill it exactly."""
    n = int(_u32(data, at)[0])
    sizes = _u32(data, at + 4, n).astype(np.int64)
    at += 4 + 4 * n
    if at + int(sizes.sum()) != len(data):
        raise _Bad(f"{n} {noun} of {int(sizes.sum())} bytes do not fill the {len(data) - at} bytes after the header")
    items = []
    for size in sizes.tolist():
        items.append(data[at:at + size])
        at += size
    return items


def _image_list(element: Callable) -> Callable:
    def decode(data):
        return [element(item) for item in _sized_items(data, 4, "elements")]
    return decode


def _jpeg_array(data):
    if int(_u32(data, 0)[0]) == 0:
        raise _Bad("jpeg_array with 0 images (streaming refuses to decode it too)")
    return [_image_file(item) for item in _sized_items(data, 0, "images")]


def _pickle(data):
    return pickle.loads(bytes(data))


_CODECS: dict[str, tuple[Callable, int | None]] = {
    "bytes": (bytes, None), "str": (_text, None), "int": (_int, 8), "json": (_json, None),
    "str_int": (lambda d: int(_text(d)), None), "str_float": (lambda d: float(_text(d)), None),
    "str_decimal": (_decimal, None), "pil": (_pil, None), "jpeg": (_image_file, None), "png": (_image_file, None),
    "list[pil]": (_image_list(_pil), None), "list[jpeg]": (_image_list(_image_file), None),
    "list[png]": (_image_list(_image_file), None), "jpeg_array": (_jpeg_array, None),
    "jpegarray": (_jpeg_array, None), "pkl": (_pickle, None), "ndarray": (_ndarray(None, None), None),
}
_CODECS.update({name: (_scalar(dt), np.dtype(dt).itemsize) for name, dt in _SCALARS.items()})


def column_codec(encoding: str) -> tuple[Callable, int | None]:
    """``(decode(bytes-like) -> value, fixed size in bytes or None)`` for an MDS column encoding.

    Accepts every name MDSWriter accepts, plus ``ndarray:<dtype>[:<d0>,<d1>,...]``. Raises ValueError
    for an unknown encoding."""
    if encoding in _CODECS:
        return _CODECS[encoding]
    name, sep, config = encoding.partition(":")
    if sep and name == "ndarray":
        args = config.split(":") if config else []
        if len(args) > 2:
            raise ValueError(f"bad ndarray encoding {encoding!r} (ndarray[:dtype[:shape]])")
        dtype = args[0] if args else None
        shape = None
        if dtype is not None and dtype not in _NDARRAY_DTYPES:
            raise ValueError(f"bad ndarray dtype {dtype!r} in {encoding!r} (one of {', '.join(sorted(_NDARRAY_DTYPES))})")
        if len(args) == 2:
            try:
                shape = tuple(int(x) for x in args[1].split(","))
            except ValueError:
                raise ValueError(f"bad ndarray shape in {encoding!r}") from None
            if not shape or min(shape) < 1:
                raise ValueError(f"bad ndarray shape in {encoding!r} (dims must be >= 1)")
        fixed = int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize if shape is not None else None
        return _ndarray(dtype, shape), fixed
    raise ValueError(f"unknown MDS column encoding {encoding!r} (known: {', '.join(sorted(_CODECS))}, "
                     f"ndarray:<dtype>[:<shape>])")


# ------------------------------------------------------------------------------------------ hashes


def hash_algorithms() -> tuple[str, ...]:
    """Names accepted by ``validate_hash``: hashlib's (sha*, sha3_*, md5, blake2b/s) and xxhash's."""
    names = {a for a in hashlib.algorithms_available if hasattr(hashlib, a) and not a.startswith("shake_")}
    return tuple(sorted(names | set(XXHASH_ALGORITHMS)))


def _hasher(algo: str):
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
    """Hex digest of a file's content with ``algo`` (read in blocks)."""
    h = _hasher(algo)
    with open(path, "rb") as f:
        while block := f.read(_HASH_BLOCK):
            h.update(block)
    return h.hexdigest()


_validated: set = set()       # (path, size, mtime_ns, algo, digest) checked in this process
_validated_lock = threading.Lock()


def _check_hash(path: str, algo: str, expected: str, shard: int | None, what: str) -> None:
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


# ------------------------------------------------------------------------------------------ decompression


def _zip_blocks(path: str, family: str):
    """Decompressed content of ``path`` (one stream of ``family``) as blocks; DataError if corrupt/truncated."""
    with open(path, "rb") as fh:
        if family == "gz":
            try:
                with gzip.GzipFile(fileobj=fh) as gz:
                    while block := gz.read(_HASH_BLOCK):
                        yield block
            except (EOFError, gzip.BadGzipFile, zlib.error) as e:
                raise DataError(f"truncated or corrupt gz data: {e}", path=path) from None
            return
        if family == "snappy":
            try:
                import snappy
            except ImportError:
                raise ImportError("snappy-compressed MDS shards need the 'python-snappy' package") from None
            try:
                yield snappy.decompress(fh.read())
            except Exception as e:  # snappy.UncompressError and friends
                raise DataError(f"corrupt snappy data: {type(e).__name__}: {e}", path=path) from None
            return
        if family == "zstd":
            import zstandard
            dctx = zstandard.ZstdDecompressor()
            new, errors = dctx.decompressobj, (zstandard.ZstdError,)
        elif family == "bz2":
            new, errors = bz2.BZ2Decompressor, (OSError, EOFError, ValueError)
        elif family == "br":
            try:
                import brotli
            except ImportError:
                raise ImportError("brotli-compressed MDS shards need the 'brotli' package") from None
            new, errors = brotli.Decompressor, (brotli.error,)
        else:  # pragma: no cover - the index parser refuses other names
            raise DataError(f"unknown compression {family!r}", path=path)
        dobj, pending = new(), False
        try:
            while chunk := fh.read(_HASH_BLOCK):
                if family == "br":
                    out = dobj.process(chunk)
                    if out:
                        yield out
                    pending = not dobj.is_finished()
                    continue
                while chunk:  # one stream after another (zstd frames, bz2 streams)
                    out = dobj.decompress(chunk)
                    if out:
                        yield out
                    if dobj.eof:
                        chunk, dobj, pending = dobj.unused_data, new(), False
                    else:
                        chunk, pending = b"", True
        except errors as e:
            raise DataError(f"truncated or corrupt {family} data: {e}", path=path) from None
        if pending:
            raise DataError(f"truncated {family} data: the stream ends early", path=path)


_key_locks: dict = {}
_key_locks_lock = threading.Lock()


def _lock_for(key) -> threading.Lock:
    with _key_locks_lock:
        return _key_locks.setdefault(key, threading.Lock())


def decompressed_path(meta: ShardMeta, cache_dir: str | None) -> str:
    """Where the decompressed copy of a compressed shard lives: ``<cache_dir>/mds/<key>-<raw basename>``,
    key = hash of the compressed file's absolute path, size, mtime and the index's raw entry."""
    st = os.stat(meta.zip_path)
    ident = json.dumps([os.path.abspath(meta.zip_path), st.st_size, st.st_mtime_ns, meta.raw.basename,
                        meta.raw.bytes, meta.raw.hashes, meta.compression], sort_keys=True)
    digest = hashlib.sha256(ident.encode("utf-8", "surrogateescape")).hexdigest()[:32]
    return os.path.join(cache_dir or default_cache_dir(), "mds", f"{digest}-{meta.raw.basename}")


def _decompress(meta: ShardMeta, cache_dir: str | None, shard: int | None) -> tuple[str | None, bytes | None]:
    """``(path of the decompressed copy, None)``, or ``(None, data)`` when the cache is not writable.

    Decompresses once (per cache directory): later calls and other processes reuse the copy. Raises
    DataError for corrupt data or a decompressed size other than ``raw_data.bytes``.
    """
    target = decompressed_path(meta, cache_dir)
    with _lock_for(target):
        try:
            if os.path.getsize(target) == meta.raw.bytes:
                return target, None
        except OSError:
            pass
        family = meta.compression.partition(":")[0]
        tmp = None
        try:
            os.makedirs(os.path.dirname(target), exist_ok=True)
            fd, tmp = tempfile.mkstemp(prefix=".zephon-mds-", suffix=".tmp", dir=os.path.dirname(target))
            f = os.fdopen(fd, "wb")
        except OSError:
            f = None
        try:
            size, parts = 0, []
            try:
                for block in _zip_blocks(meta.zip_path, family):
                    size += len(block)
                    if size > meta.raw.bytes:
                        raise DataError(f"decompresses to more than raw_data.bytes={meta.raw.bytes} bytes",
                                        path=meta.zip_path)
                    if f is not None:
                        f.write(block)
                    else:
                        parts.append(block)
            except DataError as e:
                raise e.located(shard=shard) from None
            if size != meta.raw.bytes:
                raise DataError(f"decompresses to {size} bytes, index.json says raw_data.bytes={meta.raw.bytes}",
                                path=meta.zip_path, shard=shard)
            if f is None:
                return None, b"".join(parts)
            f.close()
            os.replace(tmp, target)
            tmp = None
            return target, None
        finally:
            if f is not None and not f.closed:
                f.close()
            if tmp is not None:
                try:
                    os.unlink(tmp)
                except OSError:
                    pass


# ------------------------------------------------------------------------------------------ reader


def data_file(meta: ShardMeta) -> str | None:
    """The file a shard is read from: the raw shard when it is present with its indexed size (always
    for an uncompressed shard; for a compressed one, e.g. after ``streaming`` decompressed it), else the
    compressed file when present, else None (missing)."""
    raw = meta.raw_path
    if meta.zip is None:
        return raw if os.path.isfile(raw) else None
    try:
        if os.path.getsize(raw) == meta.raw.bytes:
            return raw
    except OSError:
        pass
    return meta.zip_path if os.path.isfile(meta.zip_path) else None


class MdsReader:
    """Random-access reader of one MDS shard (thread-safe).

    meta: the shard's index entry. path: the file to read (``data_file(meta)``): the raw shard, or the
    compressed one, which is then decompressed into ``cache_dir`` first. shard: shard id for error
    messages. columns: return only these columns, in this order (None = all, in index order).
    validate_hash: algorithm whose digest from index.json the file must match (checked once per
    process per file). Opening raises DataError (naming file and shard) for a hash mismatch, corrupt
    compressed data, a header that is truncated or disagrees with index.json; OSError if unreadable.
    """

    format = FORMAT

    def __init__(self, meta: ShardMeta, path: str, *, shard: int | None = None, columns: Sequence[str] | None = None,
                 cache_dir: str | None = None, validate_hash: str | None = None):
        self.meta = meta
        self.path = path
        self.shard = shard
        self.columns = tuple(columns) if columns is not None else None
        self._file: PreadFile | None = None
        self._mem: bytes | None = None
        compressed = meta.zip is not None and path == meta.zip_path
        if validate_hash:
            entry = meta.zip if compressed else meta.raw
            _check_hash(path, validate_hash, entry.hashes[validate_hash], shard,
                        "the compressed shard" if compressed else "the shard")
        self.read_path = path
        if compressed:
            self.read_path, self._mem = _decompress(meta, cache_dir, shard)
            if validate_hash and validate_hash in meta.raw.hashes:
                if self._mem is None:
                    _check_hash(self.read_path, validate_hash, meta.raw.hashes[validate_hash], shard,
                                f"the decompressed copy of {path}")
                elif _digest_bytes(self._mem, validate_hash) != meta.raw.hashes[validate_hash].lower():
                    raise DataError(f"{validate_hash} checksum mismatch after decompression", path=path, shard=shard)
        if self._mem is None:
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
        off = np.frombuffer(raw, "<u4").astype(np.int64)
        self.offsets = off
        self.header_end = 4 + need
        # sample i is readable when header_end <= off[i] <= off[i+1] <= file size
        self._ok = (off[:-1] >= self.header_end) & (off[:-1] <= off[1:]) & (off[1:] <= self.file_size)

    @property
    def num_samples(self) -> int:
        return self.meta.samples

    def first_keys(self) -> list[str]:
        """Column names (requested ones if given), for ``inspect``."""
        return list(self.columns if self.columns is not None else self.meta.column_names)

    def read(self, indices: Sequence[int], on_error: str = "raise") -> list[dict]:
        """Records for ``indices`` (already range-checked by the caller), in the given order.

        Each occurrence of a repeated index gets its own dict. on_error="skip" turns a bad sample into
        ``{"__error__": str(DataError)}``; "raise" raises the DataError.
        """
        wanted = sorted(set(int(i) for i in indices))
        raw, bad = self._raw(wanted)

        def read_one(i):
            if i in bad:
                raise bad[i]
            return self.decode(i, raw[i])
        return per_sample(indices, read_one, on_error)

    def _raw(self, wanted: list[int]) -> tuple[dict, dict]:
        off, ok = self.offsets, self._ok
        raw: dict[int, bytes] = {}
        bad: dict[int, DataError] = {}
        good = []
        for i in wanted:
            if ok[i]:
                good.append(i)
            else:
                a, b = int(off[i]), int(off[i + 1])
                bad[i] = DataError(f"offsets out of range: sample spans bytes [{a}, {b}) of a {self.file_size}-byte "
                                   f"shard whose header ends at {self.header_end}"
                                   + (" (truncated shard?)" if b > self.file_size else ""),
                                   path=self.path, shard=self.shard, sample=i)
        for a, b in coalesce_runs(good, off):
            lo, hi = int(off[a]), int(off[b + 1])
            buf = self._pread(hi - lo, lo)
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
        for name, dec, fixed in self._layout:
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


def _digest_bytes(data: bytes, algo: str) -> str:
    h = _hasher(algo)
    h.update(data)
    return h.hexdigest()


# ------------------------------------------------------------------------------------------ dataset


class MdsDataset(Dataset):
    """A ``Dataset`` over the shards of one MDS ``index.json`` (one ``ShardInfo`` per shard).

    ``shards[i].path`` is the file read (raw shard, or the compressed one), ``num_samples`` the
    index's ``samples``, ``size_bytes`` / ``mtime_ns`` that file's size and time when opened. Picklable
    (index entries and options only). ``fingerprint()`` comes from the index content, so it does not
    change when a compressed shard gets decompressed or the data is copied elsewhere.
    """

    def __init__(self, name: str, shards: Sequence[ShardInfo], metas: Sequence[ShardMeta], *,
                 columns: Sequence[str] | None = None, on_error: str = "raise", cache_dir: str | None = None,
                 split: str | None = None, validate_hash: str | None = None):
        super().__init__(name, shards, columns=columns, on_error=on_error, cache_dir=cache_dir)
        if len(metas) != len(self.shards):
            raise ValueError(f"{len(metas)} index entries for {len(self.shards)} shards")
        self.metas: tuple[ShardMeta, ...] = tuple(metas)
        self.split = split
        self.validate_hash = validate_hash

    def __repr__(self):
        return (f"MdsDataset(name={self.name!r}, shards={len(self.shards)}, num_samples={self.num_samples}, "
                f"columns={self.columns!r}, split={self.split!r}, on_error={self.on_error!r})")

    def _make_reader(self, shard_id: int):
        info, meta = self.shards[shard_id], self.metas[shard_id]

        def open_reader():
            try:
                return MdsReader(meta, info.path, shard=shard_id, columns=self.columns, cache_dir=self.cache_dir,
                                 validate_hash=self.validate_hash)
            except OSError as e:
                raise DataError(f"cannot read file: {e.strerror or e}", path=info.path, shard=shard_id) from e

        return self._open_or_broken(shard_id, open_reader,
                                    self.columns if self.columns is not None else meta.column_names)

    def fingerprint(self) -> dict:
        """``{"name", "columns", "format": "mds", "shards": [[raw basename, samples, raw bytes,
        {algorithm: hexdigest}], ...]}`` from index.json (no paths, mtimes or compressed sizes)."""
        return {
            "name": self.name,
            "columns": list(self.columns) if self.columns is not None else None,
            "format": FORMAT,
            "shards": [[m.raw.basename, m.samples, m.raw.bytes, dict(sorted(m.raw.hashes.items()))]
                       for m in self.metas],
        }


def open_mds(source, *, name: str | None = None, columns: Sequence[str] | None = None,
             cache_dir: str | None = None, on_error: str = "raise", split: str | None = None,
             allow_unsafe_types: bool = False, validate_hash: str | None = None) -> MdsDataset:
    """Open an MDS dataset written by ``streaming.MDSWriter`` (see the module docstring for the layout).

    source: the dataset directory (holding ``index.json``), a root with split directories (then pass
    ``split``: ``<source>/<split>/index.json``), or the path of an ``index.json``. One dataset per call:
    open several directories with several calls. name: default the directory name (``root/split`` with
    a split). columns: return only these columns (all shards must have them). cache_dir: where
    compressed shards are decompressed (``<cache_dir>/mds/``; default ``$ZEPHON_CACHE_DIR`` or
    ``~/.cache/zephon``). on_error: "raise" | "skip" (see ``Dataset.read``). allow_unsafe_types: allow
    ``pkl`` columns (unpickling runs arbitrary code; not needed when ``columns`` leaves them out). validate_hash: a hash algorithm the index
    recorded (e.g. "sha1", "xxh64"); each shard file is checked once per process, on first read.

    Raises DataError (always, whatever on_error): no index.json (naming the splits when the root has
    some), a bad index.json, an unknown encoding or compression, a refused ``pkl`` column, a requested
    column or the validate_hash algorithm missing from a shard's entry, a shard file missing.
    ValueError for bad arguments (unknown hash algorithm, a list of sources).
    """
    if on_error not in ("raise", "skip"):
        raise ValueError(f"on_error must be 'raise' or 'skip', not {on_error!r}")
    if split is not None and (not isinstance(split, str) or not split):
        raise ValueError(f"split must be a non-empty string or None, not {split!r}")
    if validate_hash is not None:
        if not isinstance(validate_hash, str):
            raise ValueError(f"validate_hash must be a hash algorithm name or None, not {validate_hash!r}")
        _hasher(validate_hash)  # ValueError for an unknown name, ImportError without xxhash
    if isinstance(columns, str):
        columns = [columns]
    columns = tuple(columns) if columns is not None else None
    index_path = find_index(source, split)
    metas = parse_index(index_path, allow_unsafe_types, columns)
    if not metas:
        raise DataError("index.json lists no shards", path=index_path)
    shards = []
    for i, m in enumerate(metas):
        if columns is not None:
            missing = [c for c in columns if c not in m.column_names]
            if missing:
                raise DataError(f"missing column {missing[0]!r} (shard has: {', '.join(map(repr, m.column_names))})",
                                path=index_path, shard=i)
        path = data_file(m)
        if path is None:
            listed = m.raw.basename if m.zip is None else f"{m.zip.basename} (or {m.raw.basename})"
            raise DataError(f"shard file missing: index.json lists {listed}", path=m.zip_path or m.raw_path, shard=i)
        if validate_hash is not None:
            entry = m.zip if (m.zip is not None and path == m.zip_path) else m.raw
            if validate_hash not in entry.hashes:
                recorded = (f"only {sorted(entry.hashes)}" if entry.hashes
                            else "no hashes (MDSWriter(hashes=[...]) was not set)")
                raise DataError(f"validate_hash={validate_hash!r}, but the index recorded {recorded} for "
                                f"{entry.basename}", path=index_path, shard=i)
        st = os.stat(path)
        shards.append(ShardInfo(path, m.samples, FORMAT, st.st_size, st.st_mtime_ns))
    if name is None:
        root = os.path.abspath(os.fspath(source))
        if os.path.isfile(root):
            root = os.path.dirname(root)
        name = os.path.basename(root) + (f"/{split}" if split is not None else "")
    return MdsDataset(name, shards, metas, columns=columns, on_error=on_error, cache_dir=cache_dir,
                      split=split, validate_hash=validate_hash)
