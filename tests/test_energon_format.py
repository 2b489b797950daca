"""Energon-prepared WebDataset reader: content equal to megatron-energon 7.4's own loader, split and
exclude semantics, Metadataset v2 leaves, and clear errors for bad input.

Data is built by the real tools (webdataset.ShardWriter + energon prepare), see tests/energon_data.py.
"""
from __future__ import annotations

import os
import pickle
import struct
import tarfile

import numpy as np
import pytest

pytest.importorskip("megatron.energon")
pytest.importorskip("webdataset")

import energon_data as E  # noqa: E402

from zephon.formats import DataError, open_dataset  # noqa: E402
from zephon.formats import energon as zen  # noqa: E402
from zephon.formats.energon import wds as zwds  # noqa: E402


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    d = str(tmp_path_factory.mktemp("energon"))
    text, text_keys = E.text_dataset(d)
    images, image_keys = E.image_dataset(d)
    return {
        "dir": d, "text": text, "text_keys": text_keys, "images": images, "image_keys": image_keys,
        "crude": E.crude_dataset(d), "textjson": E.text_json_dataset(d), "dups": E.duplicate_key_dataset(d),
        "mds": E.metadataset(os.path.join(d, "mds"), text, images),
    }


# ------------------------------------------------------------------------------------------ helpers


def _wc():
    from megatron.energon import WorkerConfig

    return WorkerConfig.default_worker_config(0)


def energon_factory_samples(root: str, split_part: str) -> dict:
    """Every sample of a split through Energon's own factory (dataset.yaml -> sample loader + default
    decoder) and tar reader, in order, excluded samples dropped by Energon's sample filter: {key: sample}."""
    from megatron.energon.dataset_config import get_dataset_from_config
    from megatron.energon.epathlib import EPath
    from megatron.energon.flavors.webdataset.itar_reader import ShardInfosITarReader

    factory = get_dataset_from_config(EPath(root), split_part=split_part, training=False, worker_config=_wc())
    reader = ShardInfosITarReader(factory.path, factory.shards, part_filter=factory.part_filter,
                                  sample_filter=factory.sample_filter)
    out = {}
    for i in range(len(reader)):
        raw = reader[i]
        if raw is None:
            continue
        s = factory.load_sample(raw)
        key = s["__key__"] if isinstance(s, dict) else s.__key__
        assert key not in out
        out[key] = s
    reader.close()
    return out


def zephon_samples(ds) -> dict:
    out = {}
    for sid, n in enumerate(ds.shard_sizes):
        for rec in ds.read(sid, range(n)):
            assert rec["__key__"] not in out, f"key {rec['__key__']} read twice in one epoch"
            out[rec["__key__"]] = rec
    return out


def same(a, b) -> bool:
    import torch
    from PIL import Image

    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return type(a) is type(b) and a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b)
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        return type(a) is type(b) and a.dtype == b.dtype and np.array_equal(a, b)
    if isinstance(a, Image.Image):
        return isinstance(b, Image.Image) and a.mode == b.mode and a.size == b.size and a.tobytes() == b.tobytes()
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return isinstance(b, (list, tuple)) and len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    return type(a) is type(b) and a == b


# ------------------------------------------------------------------------------------------ equality


@pytest.mark.contract("energon.format")
def test_text_split_content_equals_energon_loader(data):
    """Full Energon loader path (get_val_dataset + get_loader): every key, text and restore index equal."""
    from megatron.energon import get_loader, get_val_dataset

    ds = open_dataset(data["text"], split_part="train")
    assert ds.energon["sample_type"] == {"__module__": "megatron.energon", "__class__": "TextSample"}
    assert ds.energon["field_map"] == {"text": "txt"} and ds.energon["crude"] is False
    assert ds.energon["subflavors"] == {"source": "text", "lang": "en"}
    ours = zephon_samples(ds)
    assert set(ours) == data["text_keys"]["train"]
    assert ds.num_samples == len(ours) == sum(ds.shard_sizes)
    theirs = {}
    for s in get_loader(get_val_dataset(data["text"], split_part="train", worker_config=_wc(), batch_size=None)):
        theirs[s.__key__] = s
    assert set(theirs) == set(ours)
    for k, s in theirs.items():
        r = ours[k]
        assert r["__fields__"] == {"text": s.text}
        assert r["__parts__"] == {"txt": s.text}  # field_map part filter: json is not read
        assert tuple(r["__restore_key__"]) == tuple(s.__restore_key__[-2:])  # innermost ("Webdataset", idx)
        assert s.__subflavors__ == ds.energon["subflavors"]
        assert r["__shard__"] == s.__sources__[0].shard_name
    # the val split too
    val = open_dataset(data["text"], format="energon", split_part="val")
    assert set(zephon_samples(val)) == data["text_keys"]["val"]


@pytest.mark.contract("energon.format")
def test_image_caption_content_equals_energon(data):
    ds = open_dataset(data["images"], split_part="train")
    assert ds.energon["field_map"] == {"image": "jpg,png", "caption": "txt"}
    ours = zephon_samples(ds)
    assert set(ours) == data["image_keys"]["train"]
    theirs = energon_factory_samples(data["images"], "train")
    assert set(theirs) == set(ours)
    for k, s in theirs.items():
        r = ours[k]
        assert same(r["__fields__"]["image"], s.image) and s.image.dtype.is_floating_point
        assert r["__fields__"]["caption"] == s.caption
        assert tuple(r["__restore_key__"]) == tuple(s.__restore_key__)
    # grayscale png samples took the png alternative and became 3-channel like Energon's
    assert any("png" in r["__parts__"] for r in ours.values())


@pytest.mark.contract("energon.format")
def test_crude_parts_equal_energon(data):
    ds = open_dataset(data["crude"], split_part="train")
    assert ds.energon["crude"] and ds.energon["part_filter"] == ["jpg", "png", "txt", "cls", "npy"]
    assert ds.energon["subflavors"] == {"kind": "crude"}
    ours = zephon_samples(ds)
    theirs = energon_factory_samples(data["crude"], "train")
    assert set(ours) == set(theirs) and len(ours) == E.IMAGE_SHARDS * E.IMAGE_PER_SHARD
    for k, s in theirs.items():
        r = ours[k]
        parts = {p: v for p, v in s.items() if not p.startswith("__")}
        assert r["__parts__"].keys() == parts.keys()
        for p in parts:
            assert same(r["__parts__"][p], parts[p]), (k, p)
        assert r["__shard__"] == s["__shard__"] and tuple(r["__restore_key__"]) == tuple(s["__restore_key__"])
    assert {type(v).__name__ for r in ours.values() for v in r["__parts__"].values()} >= {"Tensor", "str", "int",
                                                                                          "ndarray"}


@pytest.mark.contract("energon.format")
def test_json_paths_and_alternatives_equal_energon(data):
    ds = open_dataset(data["textjson"])
    ours = zephon_samples(ds)
    theirs = energon_factory_samples(data["textjson"], "train")
    assert set(ours) == set(theirs)
    for k, s in theirs.items():
        assert ours[k]["__fields__"] == {"text": s.text} and s.text.startswith("json caption")
        assert list(ours[k]["__parts__"]) == ["json"]


def test_other_image_decodes_and_raw(data):
    from PIL import Image

    pil = open_dataset(data["images"], image_decode="pil")
    rec = pil.read(0, [0])[0]
    assert isinstance(rec["__fields__"]["image"], Image.Image) and rec["__fields__"]["image"].mode == "RGB"
    raw = open_dataset(data["images"], decode=False)
    rec = raw.read(0, [0])[0]
    assert isinstance(rec["__parts__"]["txt"], bytes) and rec["__parts__"]["jpg"][:2] == b"\xff\xd8"


@pytest.mark.contract("energon.format")
def test_epoch_holds_split_minus_exclude_and_indices_skip_excluded(data):
    ds = open_dataset(data["text"], split_part="train")
    # text-003.tar excluded as a whole; text-000 loses t0002, text-001 loses t0011; "nokey" ignored
    assert [m.name for m in ds.metas] == ["text-000.tar", "text-001.tar", "text-002.tar"]
    assert ds.shard_sizes == [5, 5, 6] and ds.n_excluded == 2
    keys = [r["__key__"] for sid in range(3) for r in ds.read(sid, range(ds.shard_sizes[sid]))]
    assert keys == sorted(data["text_keys"]["train"])  # tar order, excluded keys skipped exactly
    assert [ds.sample_key(0, i) for i in range(5)] == ["t0000", "t0001", "t0003", "t0004", "t0005"]
    # restore indices count excluded samples, as Energon's do
    assert ds.read(0, [2])[0]["__restore_key__"] == ["Webdataset", 3]
    assert ds.raw_index(1, 4) == 10 and ds.raw_index(2, 0) == 12
    # unsorted, repeated indices; each occurrence its own dict
    recs = ds.read(2, [5, 0, 5])
    assert [r["__key__"] for r in recs] == ["t0017", "t0012", "t0017"] and recs[0] is not recs[2]
    with pytest.raises(IndexError):
        ds.read(0, [5])
    # picklable: a copy reads the same
    ds2 = pickle.loads(pickle.dumps(ds))
    assert [r["__key__"] for r in ds2.read(1, range(5))] == [r["__key__"] for r in ds.read(1, range(5))]
    fp = ds.fingerprint()
    assert fp["format"] == "energon" and fp["shards"][0][:3] == ["text-000.tar", 5, 6]


def test_keys_from_headers_equal_keys_from_sqlite(data, tmp_path):
    """Without index.sqlite the keys come from tar headers read through the .tar.idx offsets."""
    root = E.copy_dataset(data["text"], str(tmp_path / "nosql"))
    os.unlink(os.path.join(root, ".nv-meta", "index.sqlite"))
    a, b = open_dataset(data["text"]), open_dataset(root)
    assert a.shard_sizes == b.shard_sizes
    assert [a.sample_key(s, i) for s in range(3) for i in range(a.shard_sizes[s])] == \
        [b.sample_key(s, i) for s in range(3) for i in range(b.shard_sizes[s])]


@pytest.mark.contract("energon.format")
def test_legacy_info_yaml_and_split_json(data, tmp_path):
    import json

    import yaml

    root = E.copy_dataset(data["text"], str(tmp_path / "legacy"))
    meta = os.path.join(root, ".nv-meta")
    with open(os.path.join(meta, ".info.json")) as f:
        info = json.load(f)
    os.unlink(os.path.join(meta, ".info.json"))
    with open(os.path.join(meta, ".info.yaml"), "w") as f:
        yaml.safe_dump(info, f)
    with open(os.path.join(meta, "split.yaml")) as f:
        split = yaml.safe_load(f)
    os.unlink(os.path.join(meta, "split.yaml"))
    with open(os.path.join(meta, "split.json"), "w") as f:
        json.dump(split, f)
    assert zephon_samples(open_dataset(root)).keys() == data["text_keys"]["train"]


# ------------------------------------------------------------------------------------------ metadataset


@pytest.mark.contract("energon.metadataset")
def test_metadataset_leaves_equal_energon(data):
    from megatron.energon.epathlib import EPath
    from megatron.energon.metadataset import loader

    leaves = zen.load_metadataset(data["mds"], "train")
    theirs = loader.load_dataset(EPath(data["mds"])).get_datasets(training=False, split_part="train",
                                                                  worker_config=_wc())
    # Energon >= 7.4 also exposes each leaf's own (unmerged) subflavors; 7.3 only the merged ones, checked below.
    trav = (loader.traverse_metadataset(EPath(data["mds"]), split_part="train")
            if hasattr(loader, "traverse_metadataset") else [None] * len(theirs.datasets))
    assert len(leaves) == len(theirs.datasets) == len(trav) == 3
    for leaf, ld, tr in zip(leaves, theirs.datasets, trav):
        assert leaf["path"] == str(ld.dataset.path)
        assert leaf["weight"] == pytest.approx(ld.weight) and leaf["repetitions"] == ld.repetitions
        if tr is not None:
            assert leaf["path"] == str(tr.path) and leaf["subflavors"] == tr.subflavors
        assert {**open_dataset(leaf["path"]).energon["subflavors"], **leaf["subflavors"]} == ld.dataset.subflavors
        sub = ld.dataset.subset
        if sub is None:
            assert leaf["subset"] is None
        else:
            assert leaf["subset"]["range"] == pytest.approx(sub.range)
            assert leaf["subset"]["absolute_range"] == sub.absolute_range
            total = len(ld.dataset)
            assert zen.subset_bounds(leaf["subset"], total) == sub.compute_subset(total)
    assert [leaf["weight"] for leaf in leaves] == pytest.approx([2 / 3, 1 / 3 * 3 / 4, 1 / 3 * 1 / 4])
    val = zen.load_metadataset(data["mds"], "val")
    assert len(val) == 1 and val[0]["weight"] is None and val[0]["path"] == data["images"]


@pytest.mark.contract("energon.metadataset")
def test_subset_keys_equal_energon_loader(data, tmp_path):
    """A metadataset leaf subset, applied with with_subset, holds the keys Energon's loader yields for it."""
    import yaml
    from megatron.energon import get_loader, get_val_dataset

    p = tmp_path / "sub.yaml"
    p.write_text(yaml.safe_dump({"__module__": "megatron.energon", "__class__": "MetadatasetV2", "splits": {
        "val": {"path": data["text"], "split_part": "train", "subset": {"range": ["10%", "70%"]}}}}))
    (leaf,) = zen.load_metadataset(str(p), "val")
    ds = open_dataset(leaf["path"], split_part=leaf["split_part"]).with_subset(leaf["subset"])
    theirs = {s.__key__ for s in get_loader(get_val_dataset(str(p), split_part="val", worker_config=_wc(),
                                                            batch_size=None))}
    ours = zephon_samples(ds)
    assert set(ours) == theirs and ds.subset["bounds"] == (1, 12)  # int(18 * .1), int(18 * .7)
    assert [m.name for m in ds.metas] == ["text-000.tar", "text-001.tar"]


@pytest.mark.contract("energon.metadataset")
def test_metadataset_blend_epochized(data, tmp_path):
    import yaml
    from megatron.energon.epathlib import EPath
    from megatron.energon.metadataset.loader import load_dataset

    inner = tmp_path / "inner.yaml"
    inner.write_text(yaml.safe_dump({"__module__": "megatron.energon", "__class__": "MetadatasetV2", "splits": {
        "train": {"blend_epochized": [{"path": data["text"], "repetitions": 2},
                                      {"path": data["images"], "repetitions": 0.5, "split_part": "val"}]}}}))
    outer = tmp_path / "outer.yaml"
    outer.write_text(yaml.safe_dump({"__module__": "megatron.energon", "__class__": "MetadatasetV2", "splits": {
        "train": {"blend_epochized": [{"path": str(inner), "repetitions": 3}, {"path": data["crude"]}]}}}))
    leaves = zen.load_metadataset(str(outer), "train")
    theirs = load_dataset(EPath(str(outer))).get_datasets(training=False, split_part="train", worker_config=_wc())
    assert [leaf["repetitions"] for leaf in leaves] == [ld.repetitions for ld in theirs.datasets] == [6, 1.5, 1]
    assert [leaf["split_part"] for leaf in leaves] == ["train", "val", "train"]
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump({"__module__": "megatron.energon", "__class__": "MetadatasetV2", "splits": {
        "train": {"blend": [{"path": str(inner)}, {"path": data["crude"]}]}}}))
    with pytest.raises(DataError, match="cannot mix blend"):
        zen.load_metadataset(str(bad), "train")
    with pytest.raises(DataError, match="no split 'test'"):
        zen.load_metadataset(str(outer), "test")


# ------------------------------------------------------------------------------------------ parsing


@pytest.mark.contract("energon.format")
def test_yaml_scalars_typed_like_energon():
    from megatron.energon.eyaml import load_yaml

    doc = (b"a: yes\nb: No\nc: ~\nd: 0012\ne: 1.5\nf: 1e3\ng: hello\nh: '12'\ni: \"true\"\nj: [1, x, 2.0, null]\n"
           b"k: {x: 1_000, y: .5}\nl: 25%\nm: end\n")
    assert zen.load_yaml(doc) == load_yaml(doc)


def test_braceexpand_like_energon():
    import braceexpand

    for p in ["a-{000..012}.tar", "x{a,b{1..3}}y", "{c..a}", "{1..10..3}", "s{07..10}", "plain.tar",
              "n{2..-1}", r"{1\{2,3}", "{a,b}{c,d}", "{x}", "{}"]:
        assert zen.braceexpand(p) == list(braceexpand.braceexpand(p)), p


@pytest.mark.contract("energon.format")
def test_split_name_like_energon():
    from megatron.energon.flavors.webdataset.config import skip_meta_re, split_name_re

    for name in ["a.txt", "dir/a.b/x.seg.jpg", "noext", "a/b/.hidden.txt", "x.", "__meta__.json", "d/__k__/a.txt",
                 "a.tar.gz"]:
        m = split_name_re.match(name)
        expect = None if skip_meta_re.match(name) or not m else m.groups()
        assert zwds.split_name(name) == expect, name


@pytest.mark.contract("energon.format")
def test_decode_part_like_webdataset_decoder():
    import gzip
    import io
    import json

    from megatron.energon.flavors.webdataset.sample_decoder import SampleDecoder

    dec = SampleDecoder()
    arr = np.arange(4, dtype=np.int16)
    b = io.BytesIO()
    np.save(b, arr)
    cases = {"txt": b"hi", "text": b"t", "json": json.dumps({"a": [1]}).encode(), "cls": b" 7\n", "id": b"3",
             "npy": b.getvalue(), "json.gz": gzip.compress(b'{"z": 1}'), "bin": b"\x00\x01", "seg.txt": b"seg"}
    for part, raw in cases.items():
        assert same(zwds.decode_part(part, raw), dec.decode(f"k.{part}", raw)), part
    import torch

    b = io.BytesIO()
    torch.save({"w": torch.arange(3)}, b)
    assert same(zwds.decode_part("pth", b.getvalue()), dec.decode("k.pth", b.getvalue()))
    with pytest.raises(zwds.UnsafePartError, match="allow_unsafe_types"):
        zwds.decode_part("pkl", pickle.dumps(1))
    assert zwds.decode_part("pkl", pickle.dumps([1]), allow_unsafe_types=True) == [1]


# ------------------------------------------------------------------------------------------ bad input


def test_no_nv_meta(tmp_path):
    E.write_text_tars(str(tmp_path / "raw"), shards=1)
    with pytest.raises(DataError, match=r"\.nv-meta.*energon prepare"):
        open_dataset(str(tmp_path / "raw"), format="energon")


def test_missing_tar_idx(data, tmp_path):
    root = E.copy_dataset(data["text"], str(tmp_path / "noidx"))
    os.unlink(os.path.join(root, "text-001.tar.idx"))
    with pytest.raises(DataError, match=r"text-001\.tar.*energon prepare") as ei:
        open_dataset(root)
    assert ei.value.path.endswith("text-001.tar")


def test_unknown_split_part_and_stale_info(data, tmp_path):
    import json

    with pytest.raises(DataError, match=r"no split part 'test' \(split parts here: train, val\)"):
        open_dataset(data["text"], split_part="test")
    root = E.copy_dataset(data["text"], str(tmp_path / "stale"))
    p = os.path.join(root, ".nv-meta", ".info.json")
    with open(p) as f:
        info = json.load(f)
    info["shard_counts"]["text-002.tar"] = 7
    with open(p, "w") as f:
        json.dump(info, f)
    ds = open_dataset(root)
    with pytest.raises(DataError, match=r"text-002\.tar \(shard 2\).*has 7 offsets, expected 8"):
        ds.read(2, [0])


def _member_offsets(tar_path):
    with tarfile.open(tar_path) as t:
        return [(m.name, m.offset, m.offset_data) for m in t]


def test_corrupt_member_named_and_skippable(data, tmp_path):
    root = E.copy_dataset(data["text"], str(tmp_path / "corrupt"))
    tar = os.path.join(root, "text-002.tar")
    members = _member_offsets(tar)
    name, off, _ = [m for m in members if m[0] == "t0015.txt"][0]
    with open(tar, "r+b") as f:  # break the header checksum of t0015.txt (sample 3 of the shard)
        f.seek(off + 148)
        f.write(b"99999999")
    ds = open_dataset(root)
    with pytest.raises(DataError) as ei:
        ds.read(2, [3])
    msg = str(ei.value)
    assert "text-002.tar (shard 2, sample 3)" in msg and "t0015" in msg and "corrupt" in msg
    assert ds.read(2, [2])[0]["__key__"] == "t0014"  # neighbours still read
    skip = open_dataset(root, on_error="skip")
    recs = skip.read(2, [2, 3, 4])
    assert "__error__" in recs[1] and "t0015" in recs[1]["__error__"]
    assert [r.get("__key__") for r in recs] == ["t0014", None, "t0016"]


def test_offset_mismatch(data, tmp_path):
    root = E.copy_dataset(data["text"], str(tmp_path / "offsets"))
    idx = os.path.join(root, "text-001.tar.idx")
    with open(idx, "r+b") as f:  # sample 2 now starts at sample 2's second member
        f.seek(8 * 2)
        (o,) = struct.unpack("<Q", f.read(8))
        f.seek(8 * 2)
        f.write(struct.pack("<Q", o + 1024))
    ds = open_dataset(root)
    with pytest.raises(DataError, match=r"text-001\.tar \(shard 1.*(do not match|corrupt)"):
        ds.read(1, [1, 2])


def test_duplicate_keys(data):
    ds = open_dataset(data["dups"])
    assert ds.shard_sizes == [3]
    assert ds.read(0, [1])[0]["__parts__"] == {"txt": "two"}
    with pytest.raises(DataError, match=r"d-000\.tar \(shard 0, sample 2\): key 'dup': duplicate sample key.*\[0, 2\]"):
        ds.read(0, [2])
    assert "__error__" in open_dataset(data["dups"], on_error="skip").read(0, [0])[0]


def test_missing_field_map_part(data, tmp_path):
    import yaml

    root = E.copy_dataset(data["text"], str(tmp_path / "fm"))
    with open(os.path.join(root, ".nv-meta", "dataset.yaml"), "w") as f:
        yaml.safe_dump({"sample_type": {"__module__": "megatron.energon", "__class__": "TextSample"},
                        "field_map": {"text": "md,caption"}}, f)
    ds = open_dataset(root)
    with pytest.raises(DataError, match=r"text-000\.tar \(shard 0, sample 1\): key 't0001': field_map field 'text' "
                                        r"= 'md,caption': part 'md'/'caption' missing"):
        ds.read(0, [1])


def test_non_energon_args_refused(tmp_path):
    with pytest.raises(ValueError, match="Energon datasets only"):
        open_dataset(str(tmp_path), split_part="train")
