"""WebDataset tar shards read by random access through Energon's ``.tar.idx`` files, and the part decoder.

Independent reader of the on-disk format as prepared by megatron-energon 7.4 ``energon prepare``;
neither ``megatron.energon`` nor ``webdataset`` is imported (only the tests use them, as the reference).

Layout
------
A shard ``data-000.tar`` is a plain (uncompressed) tar. Consecutive regular members whose names share a
*sample key* form one sample; the text after the key's dot is the *part name*. Names are split with
Energon's ``split_name_re`` = ``^((?:.*/|)[^.]+)[.]([^/]*)$``: the key is everything up to the first dot
after the last slash (``dir/a.b/x.seg.jpg`` -> key ``dir/a.b/x``, part ``seg.jpg``; a name without such a
dot is skipped). Members that are not regular files, or whose name starts with ``__...__`` (Energon's
``skip_meta_re``), are skipped.

``data-000.tar.idx`` (written by ``energon prepare`` next to the tar) is a flat array of little-endian
uint64 byte offsets: entry ``i`` is where sample ``i``'s first member header starts, and a final entry
is where the last sample ends, so a shard of ``n`` samples has ``n + 1`` entries (``8 * (n + 1)`` bytes).
Sample ``i`` is exactly the bytes ``[idx[i], idx[i + 1])``: it is read with one ``pread`` and its members
are parsed from memory with the stdlib ``tarfile`` header parser (ustar, GNU long names and pax headers).

Decoding (``decode_part``) follows Energon's ``DEFAULT_DECODER`` (``SampleDecoder()``: webdataset's
``Decoder`` with ``gz`` pre-handler, ``imagehandler("torchrgb")``, Energon's AV handler, then
``basichandlers``), see ``decode_part`` for the table.
"""
from __future__ import annotations

import gzip
import io
import json
import os
import re
import tarfile
from typing import Any

import numpy as np

from .errors import DataError

# Energon 7.4 flavors/webdataset/config.py
SPLIT_NAME_RE = re.compile(r"^((?:.*/|)[^.]+)[.]([^/]*)$")
SKIP_META_RE = re.compile(r"__[^/]*__($|/)")
ITAR_SUFFIX = ".tar.idx"

# webdataset 1.0 autodecode.IMAGE_EXTENSIONS (what PIL opens), matched lower-cased on the last dot-component
IMAGE_EXTENSIONS = frozenset(
    "blp bmp dib bufr cur pcx dcx dds ps eps fit fits fli flc ftc ftu gbr gif grib h5 hdf png apng jp2 j2k "
    "jpc jpf jpx j2c icns ico im iim tif tiff jfif jpe jpg jpeg mpg mpeg msp pcd pxr pbm pgm ppm pnm psd bw "
    "rgb rgba sgi ras tga icb vda vst webp wmf emf xbm xpm".split())
# Energon's AVWebdatasetDecoder: these become lazy AVDecoder objects in Energon; we keep the bytes.
AV_EXTENSIONS = ("mp4", "avi", "mov", "webm", "mkv", "flac", "mp3", "wav", "flv")
# webdataset imagespecs: name -> (array type, element type, mode)
IMAGE_SPECS = {
    "l8": ("numpy", "uint8", "l"), "rgb8": ("numpy", "uint8", "rgb"), "rgba8": ("numpy", "uint8", "rgba"),
    "l": ("numpy", "float", "l"), "rgb": ("numpy", "float", "rgb"), "rgba": ("numpy", "float", "rgba"),
    "torchl8": ("torch", "uint8", "l"), "torchrgb8": ("torch", "uint8", "rgb"),
    "torchrgba8": ("torch", "uint8", "rgba"), "torchl": ("torch", "float", "l"),
    "torchrgb": ("torch", "float", "rgb"), "torch": ("torch", "float", "rgb"),
    "torchrgba": ("torch", "float", "rgba"), "pill": ("pil", None, "l"), "pil": ("pil", None, "rgb"),
    "pilrgb": ("pil", None, "rgb"), "pilrgba": ("pil", None, "rgba"),
}
DEFAULT_IMAGE_DECODE = "torchrgb"  # Energon SampleDecoder default
_HEAD_READ = 8192      # bytes read to find a sample's key (more when its headers are longer)


def split_name(name: str) -> tuple[str, str] | None:
    """``(sample key, part name)`` of a tar member name, exactly as Energon splits it, or None when the
    member is not part of any sample (no dot after the last slash, or a ``__meta__`` name)."""
    if SKIP_META_RE.match(name):
        return None
    m = SPLIT_NAME_RE.match(name)
    return (m.group(1), m.group(2)) if m else None


def itar_path(tar_path: str) -> str:
    """``shard.tar`` -> ``shard.tar.idx`` (Energon's ``with_suffix(".tar.idx")``: the last suffix is replaced)."""
    root, _ext = os.path.splitext(tar_path)
    return root + ITAR_SUFFIX


def read_tar_index(idx_path: str, tar_size: int, count: int, *, tar_path: str, shard: int | None = None) -> np.ndarray:
    """The uint64 offsets of a ``.tar.idx`` as an int64 array of ``count + 1`` entries.

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
    """Members of one sample from its bytes ``[idx[i], idx[i+1])``.

    Returns ``(key, {part name: raw bytes}, [member names])`` with members in tar order (a repeated part
    name keeps the last one, as Energon does). ``parts_wanted``: None for all parts, else a container or
    callable deciding by part name (Energon's ``part_filter``). ``key_only``: stop after the first member
    (then the dict is empty); the span may then be just a prefix of the sample.
    Raises ValueError with the reason for a bad header, a member running past the span, no member with a
    key, or members with different keys (caller adds file/shard/sample).
    """
    tf = _SpanTar(fileobj=io.BytesIO(span), mode="r")
    key = None
    parts: dict[str, bytes] = {}
    names: list[str] = []
    n = len(span)
    while tf.offset < n:
        at = tf.offset
        try:
            ti = tf.next()
        except tarfile.TarError as e:
            raise ValueError(f"corrupt tar header at byte +{at} of the sample ({e})") from None
        if ti is None:
            raise ValueError(f"corrupt or missing tar header at byte +{at} of the sample (the .tar.idx offsets "
                             f"do not match the tar, or the tar is damaged; re-run `energon prepare`)")
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
        if ti.sparse is not None:
            data = tf.extractfile(ti).read()
        else:
            lo = ti.offset_data
            data = span[lo:lo + ti.size]
        if len(data) != ti.size:
            raise ValueError(f"member {ti.name!r} ({ti.size} bytes) runs past the end of the sample (truncated "
                             f"tar, or .tar.idx offsets that do not match it)")
        parts[part] = bytes(data)
        names.append(ti.name)
    if key is None:
        raise ValueError("no sample member (no regular file named <key>.<part>) at this offset: the .tar.idx "
                         "offsets do not match the tar; re-run `energon prepare`")
    return key, parts, names


def sample_key_at(pread, start: int, end: int) -> str:
    """Key of the sample whose bytes are ``[start, end)``, reading only its first header(s).
    ``pread(n, at) -> bytes``. Raises ValueError like ``parse_sample``."""
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


# ------------------------------------------------------------------------------------------ decoding


class UnsafePartError(ValueError):
    """A part whose decoding would run arbitrary code (pickle, full torch.load) was refused."""


def _decode_image(data: bytes, spec: str):
    import PIL.Image

    atype, etype, mode = IMAGE_SPECS[spec]
    with io.BytesIO(data) as stream:
        img = PIL.Image.open(stream)
        img.load()
        img = img.convert(mode.upper())
    if atype == "pil":
        return img
    result = np.asarray(img)
    if etype == "float":
        result = result.astype(np.float32) / 255.0
    if mode == "l":
        if result.ndim == 3:
            result = np.mean(result[:, :, :3], axis=2)
    elif mode == "rgb":
        if result.ndim == 2:
            result = np.repeat(result[:, :, np.newaxis], 3, axis=2)
        elif result.shape[2] == 4:
            result = result[:, :, :3]
    elif mode == "rgba":
        if result.ndim == 2:
            result = np.repeat(result[:, :, np.newaxis], 4, axis=2)
            result[:, :, 3] = 255
        elif result.shape[2] == 3:
            result = np.concatenate([result, 255 * np.ones(result.shape[:2])], axis=2)
    if atype == "numpy":
        return result
    import torch

    if result.ndim == 3:
        return torch.from_numpy(result.transpose(2, 0, 1).copy())
    return torch.from_numpy(result.copy())


def _npy(data: bytes):
    import numpy.lib.format

    return numpy.lib.format.read_array(io.BytesIO(data), allow_pickle=False)


def _npz(data: bytes):
    return dict(np.load(io.BytesIO(data), allow_pickle=False))


def _torch_load(data: bytes, allow_unsafe: bool):
    import torch

    if not allow_unsafe:
        try:
            return torch.load(io.BytesIO(data), weights_only=True, map_location="cpu")
        except Exception as e:  # torch raises UnpicklingError (or others) for non-allow-listed objects
            raise UnsafePartError(f"torch.load(weights_only=True) refused it ({type(e).__name__}: "
                                  f"{str(e).splitlines()[0] if str(e) else ''}); pass allow_unsafe_types=True to "
                                  f"open_dataset if you trust this data (full unpickling runs arbitrary code)") from None
    return torch.load(io.BytesIO(data), weights_only=False, map_location="cpu")


def _unpickle(data: bytes, allow_unsafe: bool):
    if not allow_unsafe:
        raise UnsafePartError("pickle part refused (unpickling runs arbitrary code); pass allow_unsafe_types=True "
                              "to open_dataset if you trust this data")
    import pickle

    return pickle.loads(data)


def _msgpack(data: bytes):
    import msgpack  # optional, as in webdataset

    return msgpack.unpackb(data)


def _cbor(data: bytes):
    import cbor  # type: ignore  # optional, as in webdataset

    return cbor.loads(data)


def _tenbin(data: bytes):
    raise ValueError("webdataset tenbin (.ten/.tb) parts are not decoded by zephon; open the dataset with "
                     "decode=False to get the raw bytes")


_BASIC = {
    "txt": lambda d, u: d.decode("utf-8"), "text": lambda d, u: d.decode("utf-8"),
    "transcript": lambda d, u: d.decode("utf-8"),
    "cls": lambda d, u: int(d), "cls2": lambda d, u: int(d), "index": lambda d, u: int(d),
    "inx": lambda d, u: int(d), "id": lambda d, u: int(d),
    "json": lambda d, u: json.loads(d), "jsn": lambda d, u: json.loads(d),
    "pkl": _unpickle, "pickle": _unpickle, "pyd": _unpickle,
    "pth": _torch_load,
    "ten": lambda d, u: _tenbin(d), "tb": lambda d, u: _tenbin(d),
    "mp": lambda d, u: _msgpack(d), "msg": lambda d, u: _msgpack(d),
    "npy": lambda d, u: _npy(d), "npz": lambda d, u: _npz(d),
    "cbor": lambda d, u: _cbor(d),
}


def decode_part(part: str, data: bytes, *, image_decode: str | None = DEFAULT_IMAGE_DECODE,
                allow_unsafe_types: bool = False) -> Any:
    """Decode one part as Energon 7.4's default ``SampleDecoder`` (webdataset 1.0 ``Decoder``) does.

    In order (``ext`` = text after the part name's last dot):

    1. a part name ending in ``.gz`` is gunzipped first and the rest of its name decides (once);
    2. ``ext.lower()`` in ``IMAGE_EXTENSIONS`` (jpg, jpeg, png, webp, ...): decoded with PIL per
       ``image_decode`` (webdataset imagespec; default ``"torchrgb"``: ``torch.float32`` tensor of shape
       ``(3, H, W)``, values in ``[0, 1]``; ``"pil"`` a ``PIL.Image`` in RGB; ``"rgb8"`` a ``uint8`` ndarray
       ``(H, W, 3)``; ...). ``image_decode=None``: images stay bytes;
    3. audio/video (mp4 avi mov webm mkv flac mp3 wav flv): kept as raw ``bytes`` (Energon returns a lazy
       ``AVDecoder`` over those bytes);
    4. by exact ``ext``: txt/text/transcript -> ``str`` (UTF-8); cls/cls2/index/inx/id -> ``int``;
       json/jsn -> ``json.loads``; npy -> ``numpy.ndarray`` (no pickled objects); npz -> ``dict`` of arrays;
       pth -> ``torch.load(weights_only=True)`` (full ``torch.load`` only with ``allow_unsafe_types``);
       pkl/pickle/pyd -> ``pickle.loads`` only with ``allow_unsafe_types`` (else refused);
       mp/msg -> msgpack, cbor -> cbor (when those packages are installed);
    5. anything else: the raw ``bytes``.

    Raises UnsafePartError for refused unsafe parts, and the decoder's own exception (ValueError,
    UnicodeDecodeError, PIL.UnidentifiedImageError, ...) for bad data; callers wrap it in DataError.
    """
    key = "." + part
    if key.endswith(".gz"):
        data = gzip.decompress(data)
        key = key[:-3]
    ext = key[key.rfind(".") + 1:]
    if image_decode is not None and ext.lower() in IMAGE_EXTENSIONS:
        return _decode_image(data, image_decode)
    low = key.lower()
    if any(low == e or low.endswith("." + e) for e in AV_EXTENSIONS):
        return data
    fn = _BASIC.get(ext)
    if fn is not None:
        return fn(data, allow_unsafe_types)
    return data
