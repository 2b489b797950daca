"""Test datasets for the Energon reader and adapter, built by the real tools.

Tars are written with ``webdataset.ShardWriter`` and prepared by megatron-energon 7.4 (its Python prepare
API ``BaseWebdatasetFactory.prepare_dataset``, or the ``energon prepare`` CLI for the image dataset).
Every builder takes a directory (created if needed) and returns the dataset root (or YAML) path; the
expected contents are returned alongside where useful. Only importable where megatron-energon and
webdataset are installed (the test venv).
"""
from __future__ import annotations

import io
import json
import os
import shutil
import subprocess
import sys

import numpy as np

TEXT_SHARDS = 4          # text dataset: 4 shards x 6 samples
TEXT_PER_SHARD = 6
IMAGE_SHARDS = 3         # image-caption dataset: 3 shards x 4 samples
IMAGE_PER_SHARD = 4


def _writer(root: str, pattern: str, maxcount: int):
    import webdataset as wds

    os.makedirs(root, exist_ok=True)
    return wds.ShardWriter(os.path.join(root, pattern), maxcount=maxcount, verbose=0)


def write_text_tars(root: str, *, shards: int = TEXT_SHARDS, per_shard: int = TEXT_PER_SHARD, prefix: str = "t",
                    extra_json: bool = True) -> list[str]:
    """Text samples ``<prefix>NNNN`` with a ``.txt`` part (and a ``.json`` part ``{"n": i, "meta": {"tags":
    [...]}}``), ``per_shard`` per tar ``text-%03d.tar``. Returns the keys in write order."""
    keys = []
    with _writer(root, "text-%03d.tar", per_shard) as w:
        for i in range(shards * per_shard):
            key = f"{prefix}{i:04d}"
            s = {"__key__": key, "txt": f"text sample {i} \u00e9\u4e2d"}
            if extra_json:
                s["json"] = {"n": i, "meta": {"tags": [f"tag{i % 3}", "x"]}, "caption": f"json caption {i}"}
            w.write(s)
            keys.append(key)
    return keys


def _jpeg(i: int, h: int, w: int) -> bytes:
    from PIL import Image

    rng = np.random.default_rng(i)
    arr = rng.integers(0, 256, size=(h, w, 3), dtype=np.uint8)
    b = io.BytesIO()
    Image.fromarray(arr).save(b, format="JPEG", quality=90)
    return b.getvalue()


def _png_gray(i: int) -> bytes:
    from PIL import Image

    b = io.BytesIO()
    Image.fromarray((np.arange(35, dtype=np.uint8).reshape(5, 7) * (i + 1)) % 251).save(b, format="PNG")
    return b.getvalue()


def write_image_tars(root: str, *, shards: int = IMAGE_SHARDS, per_shard: int = IMAGE_PER_SHARD) -> list[str]:
    """Image-caption samples ``img/NNNN`` (keys with a slash): ``.jpg`` (RGB, varying size) or, for every
    4th sample, ``.png`` (grayscale) instead, ``.txt`` caption, ``.cls`` int and ``.npy`` array.
    Tars ``images-%02d.tar``. Returns the keys."""
    keys = []
    with _writer(root, "images-%02d.tar", per_shard) as w:
        for i in range(shards * per_shard):
            key = f"img/{i:04d}"
            s = {"__key__": key, "txt": f"a picture of {i}", "cls": str(i % 5).encode(),
                 "npy": np.arange(6, dtype=np.float32).reshape(2, 3) + i}
            if i % 4 == 3:
                s["png"] = _png_gray(i)
            else:
                s["jpg"] = _jpeg(i, 6 + i % 3, 5 + i % 2)
            w.write(s)
            keys.append(key)
    return keys


def energon_prepare(root: str, split_parts: dict[str, str], *, exclude: list[str] | None = None,
                    dataset_yaml: dict | None = None) -> str:
    """Run megatron-energon's prepare (Python API, as ``energon prepare`` does it) on all tars under
    ``root``: ``split_parts`` maps a split part to a regex over shard names (``--split-parts``), then
    writes ``exclude`` into split.yaml and ``dataset_yaml`` as .nv-meta/dataset.yaml. Returns root."""
    import yaml
    from megatron.energon.epathlib import EPath
    from megatron.energon.flavors.webdataset.base_webdataset import BaseWebdatasetFactory

    tars = sorted(os.path.relpath(os.path.join(d, f), root) for d, _, fs in os.walk(root) for f in fs
                  if f.endswith(".tar"))
    BaseWebdatasetFactory.prepare_dataset(EPath(root), tars, split_parts_patterns=list(split_parts.items()),
                                          workers=1)
    _set_split_exclude(root, exclude)
    if dataset_yaml is not None:
        with open(os.path.join(root, ".nv-meta", "dataset.yaml"), "w") as f:
            yaml.safe_dump(dataset_yaml, f, sort_keys=False)
    return root


def _set_split_exclude(root: str, exclude):
    import yaml

    if not exclude:
        return
    p = os.path.join(root, ".nv-meta", "split.yaml")
    with open(p) as f:
        split = yaml.safe_load(f)
    split["exclude"] = list(exclude)
    with open(p, "w") as f:
        yaml.safe_dump(split, f, sort_keys=False)


def energon_prepare_cli(root: str, split_parts: dict[str, str], *, sample_type: str, field_map: dict | None,
                        exclude: list[str] | None = None) -> str:
    """The real ``energon prepare --non-interactive`` CLI (from this interpreter's bin directory)."""
    exe = os.path.join(os.path.dirname(sys.executable), "energon")
    cmd = [exe, "prepare", "--non-interactive", "--no-progress", "--num-workers", "1", "--sample-type", sample_type]
    for part, pat in split_parts.items():
        cmd += ["--split-parts", f"{part}:{pat}"]
    if field_map is not None:
        cmd += ["--field-map", json.dumps(field_map)]
    cmd.append(root)
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _set_split_exclude(root, exclude)
    return root


# ------------------------------------------------------------------------------------------ datasets

TEXT_EXCLUDE = ["text-003.tar", "text-000.tar/t0002", "text-001.tar/t0011", "text-000.tar/nokey"]
TEXT_SPLITS = {"train": r"text-00[0-3]\.tar", "val": r"text-004\.tar"}


def text_dataset(d: str) -> tuple[str, dict]:
    """TextSample dataset (field_map ``text: txt``): 5 shards (4 train incl. one excluded whole, 1 val),
    single-key excludes (one naming a missing key, ignored as in Energon). Returns ``(root, expected)``
    where ``expected[split] = set of keys``."""
    root = os.path.join(d, "text")
    keys = write_text_tars(root, shards=TEXT_SHARDS + 1)
    energon_prepare(root, TEXT_SPLITS, exclude=TEXT_EXCLUDE, dataset_yaml={
        "sample_type": {"__module__": "megatron.energon", "__class__": "TextSample"},
        "field_map": {"text": "txt"}, "subflavors": {"source": "text", "lang": "en"}})
    per = TEXT_PER_SHARD
    train = {k for i, k in enumerate(keys) if i < 3 * per} - {"t0002", "t0011"}
    val = {k for i, k in enumerate(keys) if 4 * per <= i < 5 * per}
    return root, {"train": train, "val": val}


def text_json_dataset(d: str) -> str:
    """The text tars with a field_map using ``json[...]`` paths and alternatives (TextSample.text from
    ``json[caption]``), split train = everything."""
    root = os.path.join(d, "textjson")
    write_text_tars(root, shards=2, prefix="j")
    return energon_prepare(root, {"train": r".*"}, dataset_yaml={
        "sample_type": {"__module__": "megatron.energon", "__class__": "TextSample"},
        "field_map": {"text": "nothere,json[caption]"}})


def image_dataset(d: str) -> tuple[str, dict]:
    """CaptioningSample dataset prepared by the ``energon prepare`` CLI: field_map ``image: jpg,png``
    (alternatives), ``caption: txt``; train = shards 0-1, val = shard 2; excludes ``img/0005``."""
    root = os.path.join(d, "images")
    keys = write_image_tars(root)
    energon_prepare_cli(root, {"train": r"images-0[01]\.tar", "val": r"images-02\.tar"},
                        sample_type="CaptioningSample", field_map={"image": "jpg,png", "caption": "txt"},
                        exclude=["images-01.tar/img/0005"])
    per = IMAGE_PER_SHARD
    return root, {"train": set(keys[:2 * per]) - {"img/0005"}, "val": set(keys[2 * per:])}


def crude_dataset(d: str) -> str:
    """The image tars as a ``CrudeWebdataset`` with ``part_filter: [jpg, png, txt, cls, npy]`` (all parts),
    split train = everything."""
    root = os.path.join(d, "crude")
    write_image_tars(root)
    return energon_prepare(root, {"train": r".*"}, dataset_yaml={
        "__module__": "megatron.energon", "__class__": "CrudeWebdataset",
        "subflavors": {"kind": "crude"}, "part_filter": ["jpg", "png", "txt", "cls", "npy"]})


def metadataset(d: str, text_root: str, image_root: str) -> str:
    """Metadataset v2 YAML: train = blend(text weight 2 with subset [0%, 50%], nested YAML weight 1 =
    blend(image weight 3, text weight 1 with subflavors)); val = the image dataset alone."""
    import yaml

    inner = {"__module__": "megatron.energon", "__class__": "MetadatasetV2", "splits": {
        "train": {"subset": {"range": ["0%", "50%"]}, "blend": [
            {"path": os.path.relpath(image_root, d), "weight": 3, "subflavors": {"inner": 1}},
            {"path": text_root, "weight": 1, "subflavors": {"inner": 2, "who": "inner"},
             "subset": {"range": [2, "end"]}}]}}}
    outer = {"__module__": "megatron.energon", "__class__": "MetadatasetV2", "splits": {
        "train": {"blend": [
            {"path": text_root, "weight": 2, "subset": {"range": ["0%", "50%"]}, "subflavors": {"who": "outer"}},
            {"path": "inner.yaml", "weight": 1, "subflavors": {"who": "outer-nested"}}]},
        "val": {"path": os.path.relpath(image_root, d)}}}
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, "inner.yaml"), "w") as f:
        yaml.safe_dump(inner, f, sort_keys=False)
    p = os.path.join(d, "mix.yaml")
    with open(p, "w") as f:
        yaml.safe_dump(outer, f, sort_keys=False)
    return p


def duplicate_key_dataset(d: str) -> str:
    """A shard whose tar holds key ``dup`` twice (``dup.txt``, ``other.txt``, ``dup.txt``); its .tar.idx and
    .info.json written by Energon's own tar indexer (``energon prepare`` itself refuses duplicate keys
    and stops before writing .info.json)."""
    import tarfile

    from megatron.energon.epathlib import EPath
    from megatron.energon.flavors.webdataset.prepare import WebdatasetPreparator

    root = os.path.join(d, "dups")
    os.makedirs(root, exist_ok=True)
    with tarfile.open(os.path.join(root, "d-000.tar"), "w") as t:
        for name, text in (("dup.txt", b"one"), ("other.txt", b"two"), ("dup.txt", b"three")):
            ti = tarfile.TarInfo(name)
            ti.size = len(text)
            t.addfile(ti, io.BytesIO(text))
    items = list(WebdatasetPreparator._preprocess_tar("d-000.tar", {"d-000.tar": 0}, EPath(root), 50))
    count = [it for it in items if type(it).__name__ == "IndexShardInfo"][0].shard_info.count
    os.makedirs(os.path.join(root, ".nv-meta"), exist_ok=True)
    with open(os.path.join(root, ".nv-meta", ".info.json"), "w") as f:
        json.dump({"energon_version": "7.4.1", "shard_counts": {"d-000.tar": count}}, f)
    with open(os.path.join(root, ".nv-meta", "split.yaml"), "w") as f:
        f.write("split_parts:\n  train:\n  - d-000.tar\nexclude: []\n")
    return root


def copy_dataset(src: str, dst: str) -> str:
    """A copy of a prepared dataset root (to damage in a test)."""
    shutil.copytree(src, dst)
    return dst
