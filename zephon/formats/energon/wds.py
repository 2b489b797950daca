"""WebDataset conventions: how tar member names make samples and parts, and how parts are decoded.

Consecutive tar members whose names share a *sample key* form one sample; the text after the key's dot
is the *part name*. ``split_name`` splits a member name exactly as Energon 7.4 does; ``decode_part``
decodes one part as Energon's default ``SampleDecoder`` (webdataset 1.0's ``Decoder``) does. Neither
``megatron.energon`` nor ``webdataset`` is imported: the tests use them as the reference. Reading the
members of a sample from a tar is ``tar_index``'s job.
"""
from __future__ import annotations

import gzip
import io
import json
import re
from typing import Any

import numpy as np

# Energon 7.4 flavors/webdataset/config.py
SPLIT_NAME_RE = re.compile(r"^((?:.*/|)[^.]+)[.]([^/]*)$")
SKIP_META_RE = re.compile(r"__[^/]*__($|/)")

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


def split_name(name: str) -> tuple[str, str] | None:
    """``(sample key, part name)`` of a tar member name, exactly as Energon splits it.

    name: the member's path inside the tar. The key is everything up to the first dot after the last
    slash (``dir/a.b/x.seg.jpg`` -> ``("dir/a.b/x", "seg.jpg")``).
    Returns None when the member belongs to no sample (no such dot, or a ``__meta__`` name).
    """
    if SKIP_META_RE.match(name):
        return None
    m = SPLIT_NAME_RE.match(name)
    return (m.group(1), m.group(2)) if m else None


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
    result = _to_channels(result, mode)
    if atype == "numpy":
        return result
    import torch

    if result.ndim == 3:
        return torch.from_numpy(result.transpose(2, 0, 1).copy())
    return torch.from_numpy(result.copy())


def _to_channels(result: np.ndarray, mode: str) -> np.ndarray:
    """An image array with the channels of ``mode``, as webdataset's image handler makes them.

    result: ``(H, W)`` or ``(H, W, C)`` array. mode: "l" (grey, ``(H, W)``), "rgb" or "rgba" (``(H, W, 3|4)``).
    """
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
    return result


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
                                  f"open_dataset if you trust this data (full unpickling runs arbitrary code)"
                                  ) from None
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

    part: the part name (text after the sample key's dot, e.g. ``"jpg"``, ``"seg.png"``, ``"json.gz"``).
    data: the part's raw bytes.
    image_decode: webdataset imagespec for images (default ``"torchrgb"``: ``torch.float32`` tensor of shape
    ``(3, H, W)``, values in ``[0, 1]``; ``"pil"`` a ``PIL.Image`` in RGB; ``"rgb8"`` a ``uint8`` ndarray
    ``(H, W, 3)``; ...); None keeps images as bytes.
    allow_unsafe_types: also unpickle ``pkl``/``pickle``/``pyd`` and fully ``torch.load`` ``pth`` parts
    (runs arbitrary code: trusted data only).

    In order (``ext`` = text after the part name's last dot):

    1. a part name ending in ``.gz`` is gunzipped first and the rest of its name decides (once);
    2. ``ext.lower()`` in ``IMAGE_EXTENSIONS`` (jpg, jpeg, png, webp, ...): decoded with PIL per ``image_decode``;
    3. audio/video (mp4 avi mov webm mkv flac mp3 wav flv): kept as raw ``bytes`` (Energon returns a lazy
       ``AVDecoder`` over those bytes);
    4. by exact ``ext``: txt/text/transcript -> ``str`` (UTF-8); cls/cls2/index/inx/id -> ``int``;
       json/jsn -> ``json.loads``; npy -> ``numpy.ndarray`` (no pickled objects); npz -> ``dict`` of arrays;
       pth -> ``torch.load(weights_only=True)`` (full ``torch.load`` only with ``allow_unsafe_types``);
       pkl/pickle/pyd -> ``pickle.loads`` only with ``allow_unsafe_types`` (else refused);
       mp/msg -> msgpack, cbor -> cbor (when those packages are installed);
    5. anything else: the raw ``bytes``.

    Raises UnsafePartError for refused unsafe parts, and the decoder's own exception (ValueError,
    UnicodeDecodeError, PIL.UnidentifiedImageError, gzip.BadGzipFile, ...) for bad data; callers wrap it
    in DataError naming the shard and sample.
    """
    key = "." + part
    if key.endswith(".gz"):
        # webdataset's per-part gz pre-handler, kept here because it is decoder semantics (which name
        # decides after it), not a file codec: whole-file codecs live with the other formats.
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
