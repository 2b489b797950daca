"""Vision-language operators: JPEG decode, a crop seeded by the sample's identity, normalisation, caption tokens.

All four are stateless work functions (they run on any worker, in any order) and thread-safe under free
threading: each record's image is its own ``PIL.Image``; the only shared objects are the operators' settings
(read-only), the tokenizer (``tokenizers.Tokenizer.encode_batch`` mutates nothing; ``ByteTokenizer`` has no
state) and Pillow's plugin registry, initialised once under a lock before the first decode. There are no
caches. ``vision_language_ops`` chains them; benchmarks and results in docs/benchmarks.md (free-threaded
Python section).
"""
from __future__ import annotations

import hashlib
import io
import math
import threading

import numpy as np

from .base import Operator, RecordError, field_value
from .tokenize import load_tokenizer, token_id

CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)
CLIP_STD = (0.26862954, 0.26130258, 0.27577711)

_pil_lock = threading.Lock()
_pil_ready = False


def _pil():
    """``PIL.Image`` with every plugin registered (``Image.init()``), once per process under a lock: a first
    ``Image.open`` on several threads at once would otherwise register plugins concurrently."""
    global _pil_ready
    from PIL import Image

    if not _pil_ready:
        with _pil_lock:
            if not _pil_ready:
                Image.init()
                _pil_ready = True
    return Image


def identity_seed(seed: int, src, *, with_position: bool = False) -> int:
    """A 64-bit seed from ``seed`` and a record's ``__src__`` ``(dataset_id, shard_id, sample_idx, position)``:
    the sample pointer only (the same crop every time the sample is read), or with the global position too
    (``with_position``: a new crop on each pass, still the same on every runner and dp degree)."""
    if not isinstance(src, tuple) or len(src) < 3:
        raise RecordError(f"vision crop needs the sample pointer in __src__, got {src!r} (put it before any "
                          f"operator that combines samples)")
    key = src[:4] if with_position else src[:3]
    h = hashlib.blake2b(repr((int(seed),) + tuple(int(x) for x in key)).encode(), digest_size=8)
    return int.from_bytes(h.digest(), "little")


class DecodeImage(Operator):
    """Image + caption record -> ``{"image": PIL.Image (RGB), "caption": str, "__src__"}``.

    Args:
        image: field holding the image: JPEG/PNG bytes (decoded here with PIL), a ``PIL.Image`` (MDS ``jpeg``
            columns arrive decoded by the reader), or a uint8 array ``(H, W)`` / ``(H, W, 3)``.
        caption: field holding the caption (str, or UTF-8 bytes).
    Fields are looked up as columns, then Energon ``field_map`` fields, then tar parts (``field_value``).
    Raises ``RecordError`` (the engine names file, shard and sample) for a missing field, bytes that are not
    an image, or a caption that is not UTF-8 text."""

    name = "decode_image"

    def __init__(self, image: str = "image", caption: str = "caption"):
        self.image, self.caption = image, caption

    def fingerprint(self) -> dict:
        return {"op": self.name, "image": self.image, "caption": self.caption}

    def _field(self, r: dict, name: str):
        return field_value(r, name)

    def process_many(self, records: list[dict]) -> list[dict]:
        Image = _pil()
        out = []
        for r in records:
            v = self._field(r, self.image)
            try:
                if isinstance(v, (bytes, bytearray, memoryview)):
                    img = Image.open(io.BytesIO(bytes(v)))
                    img.load()
                elif isinstance(v, np.ndarray):
                    img = Image.fromarray(np.ascontiguousarray(v, dtype=np.uint8))
                elif isinstance(v, Image.Image):
                    img = v
                else:
                    raise RecordError(f"field {self.image!r} is {type(v).__name__}, expected image bytes, a "
                                      f"PIL.Image or a uint8 array", r)
                if img.mode != "RGB":
                    img = img.convert("RGB")
            except RecordError:
                raise
            except Exception as e:  # PIL raises UnidentifiedImageError, OSError (truncated), ValueError
                raise RecordError(f"field {self.image!r} does not decode as an image: {type(e).__name__}: {e}",
                                  r) from None
            c = self._field(r, self.caption)
            if isinstance(c, (bytes, bytearray)):
                try:
                    c = bytes(c).decode("utf-8")
                except UnicodeDecodeError as e:
                    raise RecordError(f"caption field {self.caption!r} is not valid UTF-8: {e}", r) from None
            elif not isinstance(c, str):
                raise RecordError(f"caption field {self.caption!r} is {type(c).__name__}, expected text", r)
            out.append({"image": img, "caption": c, "__src__": r["__src__"]})
        return out


def crop_box(rng: np.random.Generator, width: int, height: int, scale=(0.35, 1.0),
             ratio=(3 / 4, 4 / 3)) -> tuple[int, int, int, int]:
    """A random crop ``(left, top, crop_width, crop_height)`` in pixels of a ``width`` x ``height`` image:
    area a ``scale`` fraction of the image, aspect (w/h) in ``ratio`` (log-uniform), as torchvision's
    ``RandomResizedCrop``: 10 tries, then the largest centred crop whose aspect fits ``ratio``."""
    area = width * height
    log_lo, log_hi = math.log(ratio[0]), math.log(ratio[1])
    for _ in range(10):
        target = area * rng.uniform(scale[0], scale[1])
        aspect = math.exp(rng.uniform(log_lo, log_hi))
        w = int(round(math.sqrt(target * aspect)))
        h = int(round(math.sqrt(target / aspect)))
        if 0 < w <= width and 0 < h <= height:
            return int(rng.integers(0, width - w + 1)), int(rng.integers(0, height - h + 1)), w, h
    in_ratio = width / height
    if in_ratio < ratio[0]:
        w, h = width, int(round(width / ratio[0]))
    elif in_ratio > ratio[1]:
        w, h = int(round(height * ratio[1])), height
    else:
        w, h = width, height
    return (width - w) // 2, (height - h) // 2, w, h


class RandomResizedCrop(Operator):
    """``image`` -> a random crop resized to ``size`` x ``size`` (bilinear), the crop drawn from a generator
    seeded by ``seed`` and the sample's pointer (``identity_seed``): the same sample gets the same crop on
    every runner, worker, dp degree and resume (deterministic and elastic).

    Args:
        size: output side in pixels (224).
        scale: range of the crop's area as a fraction of the image's.
        ratio: range of the crop's aspect ratio (width / height).
        seed: mixed into every sample's generator.
        vary_by_pass: seed by the global position too, so a repeated sample gets a new crop on each pass.
    Output: ``image`` replaced by the ``size`` x ``size`` RGB ``PIL.Image``; ``crop_box`` (left, top, w, h)."""

    name = "random_resized_crop"

    def __init__(self, size: int = 224, *, scale=(0.35, 1.0), ratio=(3 / 4, 4 / 3), seed: int = 0,
                 vary_by_pass: bool = False):
        if size < 1 or not 0 < scale[0] <= scale[1] <= 1 or not 0 < ratio[0] <= ratio[1]:
            raise ValueError(f"need size >= 1, 0 < scale[0] <= scale[1] <= 1, 0 < ratio[0] <= ratio[1]; got "
                             f"size={size}, scale={scale}, ratio={ratio}")
        self.size, self.scale, self.ratio = int(size), tuple(scale), tuple(ratio)
        self.seed, self.vary_by_pass = int(seed), bool(vary_by_pass)

    def fingerprint(self) -> dict:
        return {"op": self.name, "size": self.size, "scale": list(self.scale), "ratio": list(self.ratio),
                "seed": self.seed, "vary_by_pass": self.vary_by_pass}

    def box_for(self, src, width: int, height: int) -> tuple[int, int, int, int]:
        """The crop box of the sample with identity ``src`` (``__src__``) in a ``width`` x ``height`` image."""
        rng = np.random.default_rng(identity_seed(self.seed, src, with_position=self.vary_by_pass))
        return crop_box(rng, width, height, self.scale, self.ratio)

    def process_many(self, records: list[dict]) -> list[dict]:
        Image = _pil()
        out = []
        for r in records:
            img = r.get("image")
            if not isinstance(img, Image.Image):
                raise RecordError(f"random_resized_crop needs a PIL image in 'image' (put DecodeImage first), got "
                                  f"{type(img).__name__}", r)
            x, y, w, h = self.box_for(r["__src__"], img.width, img.height)
            small = img.resize((self.size, self.size), Image.Resampling.BILINEAR, box=(x, y, x + w, y + h))
            out.append({**r, "image": small, "crop_box": (x, y, w, h)})
        return out


class Normalize(Operator):
    """``image`` (RGB) -> ``pixel_values``: float32 array ``(3, H, W)`` (CHW), ``(pixel / 255 - mean) / std``
    per channel (CLIP's mean and std by default). ``image`` is dropped.

    Args:
        mean / std: three per-channel values, in units of the [0, 1] pixel range."""

    name = "normalize"

    def __init__(self, mean=CLIP_MEAN, std=CLIP_STD):
        if len(mean) != 3 or len(std) != 3 or min(std) <= 0:
            raise ValueError(f"mean and std need 3 values each, std > 0; got mean={mean}, std={std}")
        self.mean, self.std = tuple(float(m) for m in mean), tuple(float(s) for s in std)
        std32 = np.asarray(self.std, np.float32)
        self._scale = (1.0 / (255.0 * std32)).astype(np.float32)           # per channel
        self._shift = (-np.asarray(self.mean, np.float32) / std32).astype(np.float32)

    def fingerprint(self) -> dict:
        return {"op": self.name, "mean": list(self.mean), "std": list(self.std)}

    def process_many(self, records: list[dict]) -> list[dict]:
        out = []
        for r in records:
            img = r.get("image")
            if img is None:
                raise RecordError("normalize needs 'image' (put DecodeImage first)", r)
            a = np.asarray(img, dtype=np.float32)                            # (H, W, 3)
            if a.ndim != 3 or a.shape[2] != 3:
                raise RecordError(f"normalize needs an RGB image, got an array of shape {a.shape}", r)
            chw = np.empty((3, a.shape[0], a.shape[1]), np.float32)
            for c in range(3):
                np.multiply(a[:, :, c], self._scale[c], out=chw[c])
                chw[c] += self._shift[c]
            rec = {k: v for k, v in r.items() if k != "image"}
            rec["pixel_values"] = chw
            out.append(rec)
        return out


class CaptionTokens(Operator):
    """``caption`` -> ``input_ids`` int32 ``[max_length]`` (``<bos>``? tokens ``<eos>``, truncated to
    ``max_length``, then padded with ``pad_id``), ``attention_mask`` uint8 ``[max_length]`` (1 on tokens) and
    ``caption_tokens`` (the length before truncation). ``caption`` is dropped unless ``keep_caption``.

    Args:
        tokenizer: ``"bytes"`` (``ByteTokenizer``; the default, no dependency), a ``tokenizers.Tokenizer``, a
            ``tokenizer.json`` path or its JSON (these need ``tokenizers``: ``ImportError`` without it).
        max_length: tokens per caption row.
        bos / eos: token strings (or ids) added at the ends; None adds none.
        pad_id: id of padding positions.
    Raises ``RecordError`` for a caption with no UTF-8 form."""

    name = "caption_tokens"

    def __init__(self, tokenizer="bytes", *, field: str = "caption", max_length: int = 64, bos="<bos>",
                 eos="<eos>", pad_id: int = 0, keep_caption: bool = False):
        if max_length < 1:
            raise ValueError(f"max_length must be >= 1, got {max_length}")
        self.tokenizer = load_tokenizer(tokenizer)
        self.field, self.max_length, self.pad_id, self.keep_caption = field, int(max_length), int(pad_id), keep_caption
        self.bos_id, self.eos_id = token_id(self.tokenizer, bos), token_id(self.tokenizer, eos)
        self._digest = hashlib.sha256(self.tokenizer.to_str().encode()).hexdigest()[:16]

    def fingerprint(self) -> dict:
        return {"op": self.name, "tokenizer_sha256": self._digest, "field": self.field, "max_length": self.max_length,
                "bos_id": self.bos_id, "eos_id": self.eos_id, "pad_id": self.pad_id}

    def process_many(self, records: list[dict]) -> list[dict]:
        if not records:
            return []
        texts = []
        for r in records:
            t = r.get(self.field)
            if not isinstance(t, str):
                raise RecordError(f"caption field {self.field!r} is {type(t).__name__}, expected text", r)
            texts.append(t)
        try:
            encs = self.tokenizer.encode_batch(texts, add_special_tokens=False)
        except TypeError:
            for r, t in zip(records, texts):
                try:
                    t.encode("utf-8")
                except UnicodeEncodeError as e:
                    raise RecordError(f"caption field {self.field!r} has no UTF-8 form: {e}", r) from None
            raise
        out, n = [], self.max_length
        for r, enc in zip(records, encs):
            ids = list(enc.ids)
            if self.bos_id is not None:
                ids.insert(0, self.bos_id)
            if self.eos_id is not None:
                ids.append(self.eos_id)
            row = np.full(n, self.pad_id, np.int32)
            k = min(n, len(ids))
            row[:k] = ids[:k]
            mask = np.zeros(n, np.uint8)
            mask[:k] = 1
            rec = {key: v for key, v in r.items() if key != self.field or self.keep_caption}
            rec.update(input_ids=row, attention_mask=mask, caption_tokens=len(ids))
            out.append(rec)
        return out


def vision_language_ops(*, image: str = "image", caption: str = "caption", size: int = 224, seed: int = 0,
                        tokenizer="bytes", max_length: int = 64, **crop) -> list[Operator]:
    """The pipeline's stateless steps: ``[DecodeImage, RandomResizedCrop, Normalize, CaptionTokens]``.
    Rows: ``pixel_values`` float32 ``(3, size, size)``, ``input_ids`` / ``attention_mask`` ``[max_length]``,
    ``caption_tokens``, ``crop_box``. ``crop``: ``scale``, ``ratio``, ``vary_by_pass`` of the crop."""
    return [DecodeImage(image, caption), RandomResizedCrop(size, seed=seed, **crop), Normalize(),
            CaptionTokens(tokenizer, max_length=max_length)]
