"""Vision-language sample datasets for tests/test_vision.py, tests/test_freethreaded.py and the free-threaded benchmark.

Natural-looking JPEGs (gradients, smooth noise, shapes, grain; 300-640 px a side, no downloads) with
captions, written by the peers' own writers: an MDS dataset with a ``jpeg`` column by
``streaming.MDSWriter``, and an Energon ``CaptioningSample`` dataset by ``webdataset.ShardWriter`` and the
real ``energon prepare`` CLI. Writing needs the default (3.11) environment; reading them needs only Zephon.
Every caption starts with ``#NNNNN`` (the sample's number), so a reader can name the source of a row.
"""
from __future__ import annotations

import io
import json
import os
import shutil
import subprocess
import sys

import numpy as np

COLOURS = {"red": (200, 40, 40), "green": (40, 160, 60), "blue": (40, 70, 200), "yellow": (230, 200, 40),
           "white": (240, 240, 240), "black": (20, 20, 20), "orange": (240, 130, 30), "purple": (130, 50, 160)}
SHAPES = ("circle", "square", "triangle", "stripe")


def natural_image(i: int, *, min_side: int = 300, max_side: int = 640):
    """Sample ``i``'s picture and caption: ``(PIL.Image RGB, caption str)``; a pure function of ``i``."""
    from PIL import Image, ImageDraw, ImageFilter

    rng = np.random.default_rng([7, i])
    w, h = (int(x) for x in rng.integers(min_side, max_side + 1, size=2))
    c0, c1 = rng.integers(0, 256, size=(2, 3)).astype(np.float32)
    t = (np.linspace(0, 1, w, dtype=np.float32)[None, :, None] * np.float32(rng.uniform(0.2, 1)) +
         np.linspace(0, 1, h, dtype=np.float32)[:, None, None] * np.float32(rng.uniform(0.2, 1)))
    t = t / t.max()
    base = c0 * (1 - t) + c1 * t                                           # (h, w, 3) gradient
    coarse = rng.normal(0, 18, size=(max(2, h // 40), max(2, w // 40), 3)).astype(np.float32)
    smooth = np.asarray(Image.fromarray(coarse[:, :, 0]).resize((w, h), Image.Resampling.BICUBIC))
    img = Image.fromarray(np.clip(base + smooth[:, :, None], 0, 255).astype(np.uint8))
    draw = ImageDraw.Draw(img)
    words = []
    for _ in range(int(rng.integers(2, 6))):
        colour = list(COLOURS)[int(rng.integers(len(COLOURS)))]
        shape = SHAPES[int(rng.integers(len(SHAPES)))]
        x0, y0 = int(rng.integers(0, w - 40)), int(rng.integers(0, h - 40))
        s = int(rng.integers(30, max(31, min(w, h) // 2)))
        box = (x0, y0, min(w - 1, x0 + s), min(h - 1, y0 + s))
        fill = COLOURS[colour]
        if shape == "circle":
            draw.ellipse(box, fill=fill)
        elif shape == "square":
            draw.rectangle(box, fill=fill)
        elif shape == "triangle":
            draw.polygon([(box[0], box[3]), (box[2], box[3]), ((box[0] + box[2]) // 2, box[1])], fill=fill)
        else:
            draw.line([(box[0], box[1]), (box[2], box[3])], fill=fill, width=int(rng.integers(3, 12)))
        words.append(f"a {colour} {shape}")
    img = img.filter(ImageFilter.GaussianBlur(float(rng.uniform(0.3, 1.5))))
    grain = rng.integers(-9, 10, size=(h, w, 3), dtype=np.int16)
    img = Image.fromarray(np.clip(np.asarray(img, np.int16) + grain, 0, 255).astype(np.uint8))
    caption = f"#{i:05d} " + ", ".join(words) + (" on a gradient" if i % 3 else " \u2014 caf\u00e9 sc\u00e8ne")
    return img, caption


def natural_jpeg(i: int) -> tuple[bytes, str]:
    """Sample ``i`` as ``(JPEG bytes, caption)`` (quality 85-92, varying with ``i``)."""
    img, caption = natural_image(i)
    b = io.BytesIO()
    img.save(b, format="JPEG", quality=85 + i % 8)
    return b.getvalue(), caption


def sample_number(caption: str) -> int:
    """The sample number a caption starts with (``#NNNNN``)."""
    return int(caption[1:6])


def write_mds(out: str, n: int, *, size_limit: int = 1 << 22,
              samples: dict | None = None) -> dict[int, tuple[bytes, str]]:
    """MDS dataset of samples ``0..n-1`` (columns ``jpeg``: the JPEG bytes unchanged, ``caption``: str) with
    ``streaming.MDSWriter``, shards of at most ``size_limit`` bytes (``samples``: reuse ``natural_jpeg``
    outputs). Returns ``{i: (jpeg bytes, caption)}``."""
    from PIL import Image
    from streaming import MDSWriter

    samples = samples or {i: natural_jpeg(i) for i in range(n)}
    tmp = out.rstrip("/") + ".jpegs"
    os.makedirs(tmp, exist_ok=True)
    try:
        with MDSWriter(out=out, columns={"jpeg": "jpeg", "caption": "str"}, size_limit=size_limit) as w:
            for i, (jpg, caption) in samples.items():
                path = os.path.join(tmp, f"{i:05d}.jpg")
                with open(path, "wb") as f:
                    f.write(jpg)
                with Image.open(path) as img:  # a JpegImageFile with a filename: MDSWriter stores the file's bytes
                    w.write({"jpeg": img, "caption": caption})
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return samples


def write_energon(root: str, n: int, *, per_shard: int = 64,
                  samples: dict | None = None) -> dict[int, tuple[bytes, str]]:
    """Energon ``CaptioningSample`` dataset of samples ``0..n-1``: tars ``vl-NNN.tar`` (``.jpg`` + ``.txt``
    parts, keys ``vl/NNNNN``) by ``webdataset.ShardWriter``, prepared by the ``energon prepare`` CLI of this
    interpreter (field_map ``image: jpg``, ``caption: txt``; split ``train`` = every tar).
    Returns ``{i: (jpeg bytes, caption)}``."""
    import webdataset as wds

    samples = samples or {i: natural_jpeg(i) for i in range(n)}
    os.makedirs(root, exist_ok=True)
    with wds.ShardWriter(os.path.join(root, "vl-%03d.tar"), maxcount=per_shard, verbose=0) as w:
        for i, (jpg, caption) in samples.items():
            w.write({"__key__": f"vl/{i:05d}", "jpg": jpg, "txt": caption})
    exe = os.path.join(os.path.dirname(sys.executable), "energon")
    subprocess.run([exe, "prepare", "--non-interactive", "--no-progress", "--num-workers", "1", "--sample-type",
                    "CaptioningSample", "--split-parts", "train:.*", "--field-map",
                    json.dumps({"image": "jpg", "caption": "txt"}), root],
                   check=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    return samples


def open_vl(kind: str, root: str):
    """``(dataset, image field, caption field)`` for a dataset written by ``write_mds`` (kind ``"mds"``: its
    reader opens the ``jpeg`` column with PIL) or ``write_energon`` (``"energon"``, opened with ``decode=False``:
    ``DecodeImage`` decodes the JPEG bytes of the parts that dataset.yaml's ``field_map`` names)."""
    from zephon.formats import open_dataset

    if kind == "mds":
        return open_dataset(root, format="mds"), "jpeg", "caption"
    if kind == "energon":  # raw parts: the field_map's part names (CaptioningSample's image and caption)
        ds = open_dataset(root, format="energon", decode=False)
        fm = ds.energon["field_map"]
        return ds, fm["image"], fm["caption"]
    raise ValueError(f"kind must be 'mds' or 'energon', got {kind!r}")


def vl_loader(kind: str, root: str, *, runner: str = "inline", num_workers: int = 2, dp: int = 1, rank: int = 0,
              canonical_replicas: int = 4, micro_batch: int = 4, seed: int = 0, exhaustion: str = "repeat",
              chunk_size: int = 16, unit_size: int = 8, max_length: int = 64, drop_last: bool = True):
    """A ``Loader`` over one VL dataset with ``vision_language_ops`` + ``Batch(micro_batch)``; global batch of
    ``canonical_replicas * micro_batch`` rows."""
    from zephon.engine import Loader
    from zephon.ops import Batch, vision_language_ops

    ds, image, caption = open_vl(kind, root)
    ops = vision_language_ops(image=image, caption=caption, seed=seed, max_length=max_length)
    return Loader([ds], ops + [Batch(micro_batch, drop_last=drop_last)], seed=seed,
                  canonical_replicas=canonical_replicas, chunk_size=chunk_size,
                  global_batch_size=canonical_replicas * micro_batch, exhaustion=exhaustion, dp_degree=dp,
                  dp_rank=rank, runner=runner, num_workers=num_workers, unit_size=unit_size)
