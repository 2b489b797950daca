"""MDS column encodings: the bytes of one column -> the Python value ``streaming`` returns for it.

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
- ``pkl`` -> ``pickle.loads`` (runs arbitrary code): listed in ``UNSAFE_ENCODINGS``, refused by the index
  parser unless ``allow_unsafe_types=True`` (or ``columns`` leaves the column out: it is then never decoded)

All integers are little endian.
"""
from __future__ import annotations

import decimal
import io
import json
import pickle
from typing import Callable

import numpy as np

UNSAFE_ENCODINGS = ("pkl",)

_SCALARS = {"uint8": "<u1", "uint16": "<u2", "uint32": "<u4", "uint64": "<u8", "int8": "<i1", "int16": "<i2",
            "int32": "<i4", "int64": "<i8", "float16": "<f2", "float32": "<f4", "float64": "<f8"}
_NDARRAY_DTYPE_CODES = {8: "uint8", 9: "int8", 16: "uint16", 17: "int16", 18: "float16", 32: "uint32",
                        33: "int32", 34: "float32", 64: "uint64", 65: "int64", 66: "float64"}
_NDARRAY_DTYPES = set(_NDARRAY_DTYPE_CODES.values())
_SHAPE_WIDTHS = {0: "<u1", 1: "<u2", 2: "<u4", 3: "<u8"}


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
    # Host data only (MDSWriter's "pkl" columns), reached only with allow_unsafe_types=True.
    return pickle.loads(bytes(data))


_ENCODINGS: dict[str, tuple[Callable, int | None]] = {
    "bytes": (bytes, None), "str": (_text, None), "int": (_int, 8), "json": (_json, None),
    "str_int": (lambda d: int(_text(d)), None), "str_float": (lambda d: float(_text(d)), None),
    "str_decimal": (_decimal, None), "pil": (_pil, None), "jpeg": (_image_file, None), "png": (_image_file, None),
    "list[pil]": (_image_list(_pil), None), "list[jpeg]": (_image_list(_image_file), None),
    "list[png]": (_image_list(_image_file), None), "jpeg_array": (_jpeg_array, None),
    "jpegarray": (_jpeg_array, None), "pkl": (_pickle, None), "ndarray": (_ndarray(None, None), None),
}
_ENCODINGS.update({name: (_scalar(dt), np.dtype(dt).itemsize) for name, dt in _SCALARS.items()})


def column_codec(encoding: str) -> tuple[Callable, int | None]:
    """``(decode(bytes-like) -> value, fixed size in bytes or None)`` for an MDS column encoding.

    encoding: every name MDSWriter accepts, plus ``ndarray:<dtype>[:<d0>,<d1>,...]``. The decoder raises
    any exception for bytes that do not decode (the reader reports it naming file, shard, sample, column).
    Raises ValueError for an unknown encoding or a bad ndarray dtype/shape."""
    if encoding in _ENCODINGS:
        return _ENCODINGS[encoding]
    name, sep, config = encoding.partition(":")
    if sep and name == "ndarray":
        args = config.split(":") if config else []
        if len(args) > 2:
            raise ValueError(f"bad ndarray encoding {encoding!r} (ndarray[:dtype[:shape]])")
        dtype = args[0] if args else None
        shape = None
        if dtype is not None and dtype not in _NDARRAY_DTYPES:
            raise ValueError(f"bad ndarray dtype {dtype!r} in {encoding!r} "
                             f"(one of {', '.join(sorted(_NDARRAY_DTYPES))})")
        if len(args) == 2:
            try:
                shape = tuple(int(x) for x in args[1].split(","))
            except ValueError:
                raise ValueError(f"bad ndarray shape in {encoding!r}") from None
            if not shape or min(shape) < 1:
                raise ValueError(f"bad ndarray shape in {encoding!r} (dims must be >= 1)")
        fixed = int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize if shape is not None else None
        return _ndarray(dtype, shape), fixed
    raise ValueError(f"unknown MDS column encoding {encoding!r} (known: {', '.join(sorted(_ENCODINGS))}, "
                     f"ndarray:<dtype>[:<shape>])")
