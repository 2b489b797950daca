"""zephon.formats.mds against MDS datasets written by the real ``streaming.MDSWriter``.

Every expected record comes from ``streaming.StreamingDataset`` reading a copy of the same directory
(its own decompression, its own decoders), never from the code under test. ``streaming`` is imported
lazily inside the tests (``pytest.importorskip``): it is a test-time dependency only.
"""
from __future__ import annotations

import gc
import io
import json
import os
import pickle
import random
import shutil
import threading
from decimal import Decimal

import numpy as np
import pytest

from zephon.formats import DataError, open_dataset
from zephon.formats import mds

from helpers import StepHasher, count_preads, make_loader, run_steps

# ---------------------------------------------------------------- writing and reference reading

SCALARS = ("uint8", "uint16", "uint32", "uint64", "int8", "int16", "int32", "int64", "float16", "float32", "float64")
ND_DTYPES = ("uint8", "int8", "uint16", "int16", "float16", "uint32", "int32", "float32", "uint64", "int64", "float64")

EVERY_ENCODING = {
    "raw": "bytes", "text": "str", "num": "int", "si": "str_int", "sf": "str_float", "sd": "str_decimal",
    "meta": "json", "arr": "ndarray", "arr_empty_cfg": "ndarray:", "arr_dt": "ndarray:int32",
    "arr_fixed": "ndarray:int32:3,4", "arr_f16": "ndarray:float16:2", "img": "pil", "jpg": "jpeg", "png": "png",
    "pils": "list[pil]", "jpgs": "list[jpeg]", "pngs": "list[png]", "jarr": "jpeg_array", "jarr2": "jpegarray",
    "obj": "pkl", **{f"s_{t}": t for t in SCALARS},
}


def _streaming():
    return pytest.importorskip("streaming")


def _image(rng, mode, w, h):
    from PIL import Image
    channels = {"L": 1, "RGB": 3, "RGBA": 4}[mode]
    arr = rng.integers(0, 256, size=(h, w, channels) if channels > 1 else (h, w), dtype=np.uint8)
    return Image.fromarray(arr, mode)


def _jpeg_bytes(img):
    out = io.BytesIO()
    img.save(out, format="JPEG")
    return out.getvalue()


def every_encoding_sample(i):
    """Sample i of the every-encoding dataset: varied values, shapes, dtypes and image modes."""
    rng = np.random.default_rng(i)
    r = random.Random(i)
    mode = ("L", "RGB", "RGBA")[i % 3]
    jmode = ("L", "RGB")[i % 2]
    nd_dtype = ND_DTYPES[i % len(ND_DTYPES)]
    shape = [(5,), (2, 3), (1, 2, 2), (300,), (2, 70000 // 1000)][i % 5]
    if i % 7 == 3:
        shape = (1, 256 * 2 + 1)  # shape values >= 256 need a uint16 shape header
    s = {
        "raw": bytes(rng.integers(0, 256, size=r.randint(0, 40), dtype=np.uint8)),
        "text": "".join(r.choice("abc é漢\n\"\\\x00") for _ in range(r.randint(0, 30))),
        "num": r.randint(-2**63, 2**63 - 1),
        "si": r.randint(-10**40, 10**40),
        "sf": r.uniform(-1e6, 1e6) if i % 4 else float("inf"),
        "sd": Decimal(f"{r.randint(-10**6, 10**6)}.{r.randint(0, 999):03d}"),
        "meta": {"i": i, "tags": [r.random() for _ in range(i % 3)], "ok": bool(i % 2), "none": None},
        "arr": ((rng.standard_normal(shape) * 100).astype(nd_dtype) if nd_dtype.startswith("float")
                else rng.integers(0, 100, size=shape).astype(nd_dtype)),
        "arr_empty_cfg": np.arange(i + 1, dtype="uint16"),
        "arr_dt": rng.integers(-5, 5, size=(i % 3 + 1, 2), dtype=np.int32),
        "arr_fixed": rng.integers(-2**31, 2**31 - 1, size=(3, 4), dtype=np.int32),
        "arr_f16": rng.standard_normal(2).astype(np.float16),
        "img": _image(rng, mode, 3 + i % 4, 2 + i % 3),
        "jpg": _image(rng, jmode, 8, 5),
        "png": _image(rng, mode, 4, 3),
        "pils": [_image(rng, mode, 2, 2) for _ in range(i % 3)],
        "jpgs": [_image(rng, jmode, 4, 4) for _ in range(1 + i % 2)],
        "pngs": [_image(rng, "RGBA", 3, 1) for _ in range(i % 2)],
        "jarr": [_jpeg_bytes(_image(rng, "RGB", 6, 6)) for _ in range(1 + i % 3)],
        "jarr2": [_jpeg_bytes(_image(rng, "L", 4, 4))],
        "obj": {"i": i, "set": {i, i + 1}, "t": (1, "x")},
    }
    for t in SCALARS:
        info = np.finfo(t) if t.startswith("float") else np.iinfo(t)
        s[f"s_{t}"] = getattr(np, t)(r.choice([info.min, info.max, 0, 1]) if i % 2 else r.random() * 100)
    return s


def write_mds(out, columns, samples, **kw):
    from streaming import MDSWriter
    with MDSWriter(out=str(out), columns=columns, **kw) as w:
        for s in samples:
            w.write(s)
    return str(out)


def streaming_records(local, *, split=None, allow_unsafe_types=False):
    """Every sample of an MDS directory as streaming.StreamingDataset returns it (in global order).
    Reads a fresh copy (StreamingDataset writes decompressed shards into its local directory)."""
    streaming = _streaming()
    from streaming.base.util import clean_stale_shared_memory
    copy = f"{local}-streaming-{random.getrandbits(32):08x}"
    shutil.copytree(local, copy)
    clean_stale_shared_memory()
    sd = streaming.StreamingDataset(local=copy, split=split, shuffle=False, batch_size=1,
                                    allow_unsafe_types=allow_unsafe_types)
    try:
        return [sd[i] for i in range(sd.num_samples)]
    finally:
        del sd
        gc.collect()
        clean_stale_shared_memory()


def zephon_records(ds):
    return [r for s, n in enumerate(ds.shard_sizes) for r in ds.read(s, list(range(n)))]


def assert_same_value(a, b, where):
    from PIL import Image
    assert type(a) is type(b), f"{where}: {type(a)} != {type(b)}"
    if isinstance(a, np.ndarray):
        assert a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes(), where
        assert a.flags.writeable == b.flags.writeable, where
    elif isinstance(a, Image.Image):
        assert (a.mode, a.size, a.format) == (b.mode, b.size, b.format), where
        assert a.tobytes() == b.tobytes(), where
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), where
        for k, (x, y) in enumerate(zip(a, b)):
            assert_same_value(x, y, f"{where}[{k}]")
    else:
        assert a == b, f"{where}: {a!r} != {b!r}"
        if isinstance(a, np.generic):
            assert a.dtype == b.dtype, where


def assert_same_records(got, want):
    assert len(got) == len(want)
    for i, (g, w) in enumerate(zip(got, want)):
        assert list(g) == list(w), f"sample {i}: columns {list(g)} != {list(w)}"
        for k in g:
            assert_same_value(g[k], w[k], f"sample {i} column {k!r}")


@pytest.fixture(autouse=True)
def _own_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("ZEPHON_CACHE_DIR", str(tmp_path / "zephon-cache"))


@pytest.fixture(scope="module")
def every_encoding(tmp_path_factory):
    """An uncompressed dataset with every encoding MDSWriter offers, several small shards."""
    _streaming()
    out = tmp_path_factory.mktemp("mds") / "every"
    samples = [every_encoding_sample(i) for i in range(24)]
    write_mds(out, EVERY_ENCODING, samples, size_limit=20000)
    return str(out)


@pytest.fixture(scope="module")
def every_encoding_reference(every_encoding):
    return streaming_records(every_encoding, allow_unsafe_types=True)


# ---------------------------------------------------------------- decoded values equal streaming's


@pytest.mark.contract("streaming.mds_format")
def test_every_encoding_equals_streaming(every_encoding, every_encoding_reference):
    ds = open_dataset(every_encoding, allow_unsafe_types=True)  # format auto-detected
    assert isinstance(ds, mds.MdsDataset)
    assert len(ds.shards) >= 4 and all(s.format == "mds" for s in ds.shards)
    index = json.load(open(os.path.join(every_encoding, "index.json")))
    assert ds.shard_sizes == [s["samples"] for s in index["shards"]]
    assert_same_records(zephon_records(ds), every_encoding_reference)
    # the types streaming gives, spelled out
    r = ds.read(1, [0])[0]
    assert type(r["num"]) is int and type(r["sd"]) is Decimal and type(r["s_float16"]) is np.float16
    assert type(r["s_uint64"]) is np.uint64 and type(r["jarr"]) is list


@pytest.mark.contract("streaming.mds_format")
def test_columns_projection_decodes_only_requested(every_encoding, every_encoding_reference):
    ds = open_dataset(every_encoding, format="mds", columns=["text", "arr_fixed"])
    got = zephon_records(ds)
    want = [{"text": w["text"], "arr_fixed": w["arr_fixed"]} for w in every_encoding_reference]
    assert_same_records(got, want)
    # a pkl column left out is never unpickled, so it needs no flag; asked for, it does
    with pytest.raises(DataError, match="'obj' uses the unsafe encoding 'pkl'.*allow_unsafe_types=True"):
        open_dataset(every_encoding, columns=["text", "obj"])
    with pytest.raises(DataError, match="missing column 'nope'"):
        open_dataset(every_encoding, columns=["nope"], allow_unsafe_types=True)


@pytest.mark.contract("streaming.mds_format")
def test_pkl_refused_without_the_flag(tmp_path):
    _streaming()
    d = write_mds(tmp_path / "p", {"a": "str", "obj": "pkl"}, [{"a": "x", "obj": [1, 2]}] * 3)
    with pytest.raises(DataError) as e:
        open_dataset(d)
    msg = str(e.value)
    assert "'obj'" in msg and "pkl" in msg and "allow_unsafe_types=True" in msg and "(shard 0)" in msg
    assert e.value.path.endswith("index.json") and e.value.shard == 0
    assert open_dataset(d, allow_unsafe_types=True).read(0, [2]) == [{"a": "x", "obj": [1, 2]}]


@pytest.mark.contract("streaming.mds_format")
@pytest.mark.parametrize("compression", ["zstd", "zstd:7", "gz", "gz:1", "bz2", "br", "br:3", "snappy"])
def test_compressed_shards_equal_streaming(tmp_path, compression):
    samples = [{"text": f"doc {i} " + "x" * (i * 7 % 50), "arr": np.arange(i % 5 + 1, dtype=np.int64) * i,
                "n": i} for i in range(40)]
    d = write_mds(tmp_path / "z", {"text": "str", "arr": "ndarray", "n": "int"}, samples, compression=compression,
                  size_limit=600)
    before = sorted(os.listdir(d))
    assert all(f == "index.json" or f.endswith(compression.split(":")[0]) for f in before)
    cache = tmp_path / "cache"
    ds = open_dataset(d, cache_dir=str(cache))
    assert len(ds.shards) >= 3 and all(s.path.endswith(compression.split(":")[0]) for s in ds.shards)
    assert_same_records(zephon_records(ds), streaming_records(d))
    assert sorted(os.listdir(d)) == before                  # nothing written next to the data
    copies = sorted(os.listdir(cache / "mds"))
    assert len(copies) == len(ds.shards) and all(c.endswith(".mds") for c in copies)
    # decompressed once: a reopened dataset reuses the copies (same files, untouched)
    stamps = {c: os.stat(cache / "mds" / c).st_mtime_ns for c in copies}
    ds2 = open_dataset(d, cache_dir=str(cache))
    assert_same_records(zephon_records(ds2), zephon_records(ds))
    assert {c: os.stat(cache / "mds" / c).st_mtime_ns for c in os.listdir(cache / "mds")} == stamps


@pytest.mark.contract("streaming.mds_format")
def test_compressed_shard_with_its_raw_file_present_reads_the_raw_file(tmp_path):
    samples = [{"text": f"doc {i}"} for i in range(30)]
    d = write_mds(tmp_path / "z", {"text": "str"}, samples, compression="zstd", size_limit=200)
    want = streaming_records(d)
    ds0 = open_dataset(d)
    # as after streaming decompressed the shards next to the data: the raw shards are read directly
    shutil.copytree(d, tmp_path / "z2")
    import zstandard
    for f in os.listdir(tmp_path / "z2"):
        if f.endswith(".zstd"):
            raw = zstandard.ZstdDecompressor().decompressobj().decompress((tmp_path / "z2" / f).read_bytes())
            (tmp_path / "z2" / f[:-5]).write_bytes(raw)
    ds = open_dataset(tmp_path / "z2", name="z", cache_dir=str(tmp_path / "unused-cache"))
    assert all(s.path.endswith(".mds") for s in ds.shards)
    assert_same_records(zephon_records(ds), want)
    assert not (tmp_path / "unused-cache").exists()
    assert ds.fingerprint() == ds0.fingerprint()  # identity from index.json, not from which file is read


@pytest.mark.contract("streaming.mds_format")
@pytest.mark.parametrize("compression", [None, "zstd"])
def test_hash_validation(tmp_path, compression):
    samples = [{"text": f"doc {i} " * 5, "n": i} for i in range(30)]
    d = write_mds(tmp_path / "h", {"text": "str", "n": "int"}, samples, compression=compression,
                  hashes=["sha1", "xxh64"], size_limit=400)
    want = streaming_records(d)
    for algo in ("sha1", "xxh64"):
        ds = open_dataset(d, validate_hash=algo, cache_dir=str(tmp_path / f"c-{algo}"))
        assert_same_records(zephon_records(ds), want)
    with pytest.raises(DataError, match=r"validate_hash='sha256'.*\['sha1', 'xxh64'\]"):
        open_dataset(d, validate_hash="sha256")
    with pytest.raises(ValueError, match="unknown hash algorithm 'nope'"):
        open_dataset(d, validate_hash="nope")
    # one flipped byte (same size) in shard 1
    bad = tmp_path / "bad"
    shutil.copytree(d, bad)
    name = sorted(f for f in os.listdir(bad) if f.startswith("shard.00001"))[0]
    raw = bytearray((bad / name).read_bytes())
    raw[-3] ^= 0x01
    (bad / name).write_bytes(bytes(raw))
    for algo in ("sha1", "xxh64"):
        ds = open_dataset(bad, validate_hash=algo, cache_dir=str(tmp_path / f"bad-{algo}"))
        assert ds.read(0, [0])[0] == {"n": 0, "text": samples[0]["text"]}
        with pytest.raises(DataError) as e:
            ds.read(1, [0])
        assert f"{algo} checksum mismatch" in str(e.value) and str(bad / name) in str(e.value)
        assert e.value.shard == 1
        skip = open_dataset(bad, validate_hash=algo, on_error="skip", cache_dir=str(tmp_path / f"bad-{algo}"))
        recs = skip.read(1, [0, 1])
        assert all("__error__" in r and "checksum mismatch" in r["__error__"] for r in recs)
        assert [f"sample {k}" in r["__error__"] for k, r in enumerate(recs)] == [True, True]


@pytest.mark.contract("streaming.mds_format")
def test_hash_algorithms_streaming_offers_are_accepted(tmp_path):
    algos = sorted(["md5", "sha256", "sha3_256", "blake2b", "blake2s", "xxh32", "xxh128", "xxh3_64", "xxh3_128",
                    "sha512"])
    d = write_mds(tmp_path / "h", {"text": "str"}, [{"text": "a"}, {"text": "b"}], hashes=algos)
    for algo in algos:
        assert open_dataset(d, validate_hash=algo).read(0, [1]) == [{"text": "b"}]


@pytest.mark.contract("streaming.mds_format")
def test_split_layout(tmp_path):
    root = tmp_path / "root"
    for split, n in (("train", 25), ("val", 7)):
        write_mds(root / split, {"text": "str", "label": "int8"},
                  [{"text": f"{split} {i}", "label": np.int8(i % 3)} for i in range(n)], size_limit=150)
    for split, n in (("train", 25), ("val", 7)):
        ds = open_dataset(root, split=split)
        assert ds.name == f"root/{split}" and ds.num_samples == n and ds.split == split
        assert_same_records(zephon_records(ds), streaming_records(str(root), split=split))
    with pytest.raises(DataError, match="splits train, val: pass split="):
        open_dataset(root, format="mds")
    with pytest.raises(DataError, match=r"no index.json for split 'test' \(splits here: train, val\)"):
        open_dataset(root, split="test")
    with pytest.raises(ValueError, match="MDS datasets only"):
        open_dataset(tmp_path, format="jsonl", validate_hash="sha1")
    # several directories are several datasets
    a, b = open_dataset(root / "train"), open_dataset(root / "val")
    assert (a.name, b.name) == ("train", "val") and a.fingerprint() != b.fingerprint()
    with pytest.raises(ValueError, match="several open_dataset calls"):
        open_dataset([root / "train", root / "val"], format="mds")
    # the index file itself is a source too
    assert open_dataset(root / "val" / "index.json").num_samples == 7


@pytest.mark.contract("streaming.mds_format")
def test_fingerprint_from_index_content(tmp_path):
    d = write_mds(tmp_path / "f", {"text": "str"}, [{"text": str(i)} for i in range(10)], hashes=["sha1"],
                  size_limit=100)
    ds = open_dataset(d)
    assert ds.shard_sizes[0] == 0  # MDSWriter writes an empty shard when the first sample exceeds size_limit
    assert_same_records(zephon_records(ds), streaming_records(d))
    index = json.load(open(os.path.join(d, "index.json")))
    fp = ds.fingerprint()
    assert fp == json.loads(json.dumps(fp))
    assert fp["shards"] == [[s["raw_data"]["basename"], s["samples"], s["raw_data"]["bytes"], s["raw_data"]["hashes"]]
                            for s in index["shards"]]
    moved = shutil.copytree(d, tmp_path / "elsewhere" / "f")
    assert open_dataset(moved).fingerprint() == fp  # no paths or mtimes


# ---------------------------------------------------------------- random access


@pytest.mark.contract("streaming.mds_format")
def test_random_access_is_order_independent_and_thread_safe(every_encoding, every_encoding_reference):
    ds = open_dataset(every_encoding, allow_unsafe_types=True)
    starts = np.concatenate([[0], np.cumsum(ds.shard_sizes)])
    rng = random.Random(7)

    def check(shard, idx, recs):
        assert_same_records(recs, [every_encoding_reference[starts[shard] + i] for i in idx])

    nonempty = [k for k, n in enumerate(ds.shard_sizes) if n]  # MDSWriter may write a 0-sample shard
    for shard in nonempty:
        n = ds.shard_sizes[shard]
        idx = [rng.randrange(n) for _ in range(2 * n)]  # unsorted, with repeats
        check(shard, idx, ds.read(shard, idx))
        check(shard, idx[::-1], ds.read(shard, idx[::-1]))
    errors = []

    def worker(seed):
        r = random.Random(seed)
        try:
            for _ in range(30):
                shard = r.choice(nonempty)
                idx = [r.randrange(ds.shard_sizes[shard]) for _ in range(3)]
                check(shard, idx, ds.read(shard, idx))
        except Exception as e:  # pragma: no cover - reported below
            errors.append(e)

    threads = [threading.Thread(target=worker, args=(s,)) for s in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    clone = pickle.loads(pickle.dumps(ds))  # what a process runner does
    check(2, [1, 0], clone.read(2, [1, 0]))


def test_uncompressed_reads_only_header_and_requested_samples(tmp_path, monkeypatch):
    samples = [{"text": f"{i:04d}" + "y" * 996} for i in range(200)]
    d = write_mds(tmp_path / "big", {"text": "str"}, samples, size_limit=None)  # one shard of ~200 kB
    ds = open_dataset(d)
    assert ds.shard_sizes == [200]
    read = count_preads(monkeypatch)
    assert ds.read(0, [150, 3]) == [{"text": samples[150]["text"]}, {"text": samples[3]["text"]}]
    assert sum(read) < 4 + 201 * 4 + 2 * 1004 + 1000  # header + two samples, far from 200 kB


# ---------------------------------------------------------------- bad input


@pytest.fixture
def plain(tmp_path):
    samples = [{"text": f"doc {i}", "n": i} for i in range(20)]
    d = write_mds(tmp_path / "plain", {"text": "str", "n": "int"}, samples, size_limit=350)
    return d, samples


def _shard_file(d, k):
    return os.path.join(d, f"shard.{k:05d}.mds")


def test_truncated_shard(plain):
    d, samples = plain
    ds0 = open_dataset(d)
    n1 = ds0.shard_sizes[1]
    path = _shard_file(d, 1)
    size = os.path.getsize(path)
    with open(path, "r+b") as f:
        f.truncate(size - 5)
    ds = open_dataset(d)
    first = sum(ds.shard_sizes[:1])
    assert ds.read(1, [0]) == [{"n": first, "text": f"doc {first}"}]
    with pytest.raises(DataError) as e:
        ds.read(1, [n1 - 1])
    assert (e.value.path, e.value.shard, e.value.sample) == (path, 1, n1 - 1)
    assert "offsets out of range" in str(e.value) and "truncated" in str(e.value)
    skip = open_dataset(d, on_error="skip")
    recs = skip.read(1, list(range(n1)))
    assert "__error__" in recs[-1] and f"sample {n1 - 1}" in recs[-1]["__error__"]
    assert recs[0] == {"n": first, "text": f"doc {first}"}
    # truncated inside the header: the whole shard is unreadable
    with open(path, "r+b") as f:
        f.truncate(6)
    ds = open_dataset(d)
    with pytest.raises(DataError, match=r"shard\.00001\.mds \(shard 1\): truncated shard"):
        ds.read(1, [0])
    recs = open_dataset(d, on_error="skip").read(1, [0, 1])
    assert [("truncated shard" in r["__error__"], f"sample {k}" in r["__error__"]) for k, r in enumerate(recs)] \
        == [(True, True)] * 2
    assert open_dataset(d).read(0, [0]) == [{"n": 0, "text": "doc 0"}]  # other shards unaffected


def test_offsets_out_of_range_and_bad_header(plain):
    d, _ = plain
    path = _shard_file(d, 0)
    raw = bytearray(open(path, "rb").read())
    bad = bytearray(raw)
    bad[8:12] = (10**9).to_bytes(4, "little")  # end of sample 0 / start of sample 1 far past the end
    open(path, "wb").write(bytes(bad))
    ds = open_dataset(d, on_error="skip")
    recs = ds.read(0, [0, 1, 2])
    assert "offsets out of range" in recs[0]["__error__"] and "sample 0" in recs[0]["__error__"]
    assert "offsets out of range" in recs[1]["__error__"] and "sample 1" in recs[1]["__error__"]
    assert recs[2] == {"n": 2, "text": "doc 2"}
    with pytest.raises(DataError, match=r"\(shard 0, sample 1\): offsets out of range"):
        open_dataset(d).read(0, [1])
    bad = bytearray(raw)
    bad[0:4] = (99).to_bytes(4, "little")
    open(path, "wb").write(bytes(bad))
    with pytest.raises(DataError, match=r"shard header says 99 samples, index.json says \d+"):
        open_dataset(d).read(0, [0])
    # a column whose bytes do not decode: invalid UTF-8 of the same length
    bad = bytearray(raw)
    at = bytes(bad).rindex(b"doc 0")
    bad[at:at + 1] = b"\xff"
    open(path, "wb").write(bytes(bad))
    with pytest.raises(DataError, match=r"\(shard 0, sample 0\): column 'text' \(str\) does not decode: Unicode"):
        open_dataset(d).read(0, [0])


def test_missing_shard_file(plain):
    d, _ = plain
    os.remove(_shard_file(d, 2))
    for mode in ("raise", "skip"):
        with pytest.raises(DataError) as e:
            open_dataset(d, on_error=mode)
        assert e.value.path == _shard_file(d, 2) and e.value.shard == 2 and "missing" in str(e.value)


def _edit_index(d, fn):
    p = os.path.join(d, "index.json")
    obj = json.load(open(p))
    fn(obj)
    json.dump(obj, open(p, "w"))


def test_unknown_encoding_and_bad_index(plain):
    d, _ = plain
    p = os.path.join(d, "index.json")
    original = open(p).read()

    def restore():
        open(p, "w").write(original)

    cases = [
        (lambda o: o["shards"][1]["column_encodings"].__setitem__(0, "int128"),
         r"\(shard 1\): bad index.json entry: column 'n': unknown MDS column encoding 'int128'"),
        (lambda o: o["shards"][0]["column_encodings"].__setitem__(0, "ndarray:complex64"), "bad ndarray dtype"),
        (lambda o: o["shards"][0].__setitem__("compression", "lz4"), "unknown compression 'lz4'"),
        (lambda o: o["shards"][0].__setitem__("format", "json"), "shard format 'json' is not supported"),
        (lambda o: o.__setitem__("version", 3), "version 3"),
        (lambda o: o["shards"][0]["raw_data"].__setitem__("basename", "../x.mds"), "plain file name"),
        (lambda o: o["shards"][0].__setitem__("samples", -1), "samples must be an int"),
        (lambda o: o["shards"][0]["column_sizes"].__setitem__(0, 4), "column_sizes says 4"),
        (lambda o: o["shards"][0].pop("column_names"), "must be lists"),
    ]
    for edit, pattern in cases:
        _edit_index(d, edit)
        for mode in ("raise", "skip"):
            with pytest.raises(DataError, match=pattern) as e:
                open_dataset(d, format="mds", on_error=mode)
            assert e.value.path == p
        restore()
    open(p, "w").write(original[:-10])
    with pytest.raises(DataError, match="not valid JSON"):
        open_dataset(d, format="mds")
    restore()
    assert open_dataset(d).num_samples == 20


def test_corrupt_compressed_shard(tmp_path):
    samples = [{"text": f"doc {i} " * 20} for i in range(30)]
    d = write_mds(tmp_path / "z", {"text": "str"}, samples, compression="zstd", size_limit=1000)
    path = os.path.join(d, "shard.00001.mds.zstd")
    data = open(path, "rb").read()
    open(path, "wb").write(data[: len(data) // 2])
    ds = open_dataset(d, cache_dir=str(tmp_path / "c"))
    assert ds.read(0, [0]) == [samples[0]]
    with pytest.raises(DataError) as e:
        ds.read(1, [0])
    assert (e.value.path, e.value.shard) == (path, 1) and "truncated" in str(e.value)
    recs = open_dataset(d, on_error="skip", cache_dir=str(tmp_path / "c")).read(1, [0])
    assert "zstd" in recs[0]["__error__"] and "sample 0" in recs[0]["__error__"]
    assert not any(f.endswith(".tmp") for f in os.listdir(tmp_path / "c" / "mds"))


def test_file_changed_after_open(plain):
    d, _ = plain
    ds = open_dataset(d)
    with open(_shard_file(d, 0), "ab") as f:
        f.write(b"x")
    with pytest.raises(DataError, match="changed since the dataset was opened"):
        ds.read(0, [0])


def test_jsonl_directory_with_a_plain_index_json_is_read_as_jsonl_only_when_asked(tmp_path):
    """A folder with index.json is MDS (issue 28: no guessing around a damaged index); format='jsonl' reads it."""
    d = tmp_path / "j"
    d.mkdir()
    (d / "index.json").write_text('{"text": "a"}\n{"text": "b"}\n')
    with pytest.raises(DataError, match="not valid JSON.*format='jsonl'"):
        open_dataset(d)
    ds = open_dataset(d, format="jsonl")
    assert ds.shards[0].format == "jsonl" and ds.num_samples == 2


# ---------------------------------------------------------------- end to end through the Loader


def test_mds_text_through_loader_elastic_and_equal_to_jsonl(tmp_path, stdlib_texts, tokenizer_path):
    docs = stdlib_texts[0][:300]
    d = write_mds(tmp_path / "docs_mds", {"text": "str", "id": "str"},
                  [{"text": t, "id": f"d{i}"} for i, t in enumerate(docs)], size_limit=15_000)
    counts = [s["samples"] for s in json.load(open(os.path.join(d, "index.json")))["shards"]]
    assert len(counts) >= 3
    jd = tmp_path / "docs_jsonl"
    jd.mkdir()
    start = 0
    for k, n in enumerate(counts):  # the same documents, one JSONL file per MDS shard
        with open(jd / f"part-{k:05d}.jsonl", "w", encoding="utf-8") as fh:
            for i in range(start, start + n):
                fh.write(json.dumps({"text": docs[i], "id": f"d{i}"}) + "\n")
        start += n
    steps = 6

    def digests(src, dp, runner):
        h = StepHasher()
        loaders = [make_loader([src], tokenizer_path, dp=dp, rank=r, runner=runner, canonical_replicas=4)
                   for r in range(dp)]
        run_steps(loaders, steps, h)
        for L in loaders:
            L.close()
        return h.digests()

    ref = digests(d, 1, "inline")
    assert len(ref) == steps and len(set(ref.values())) == steps
    assert digests(d, 2, "threads") == ref
    assert digests(d, 2, "processes") == ref  # datasets pickled into spawned workers, readers reopened there
    assert digests(str(jd), 1, "inline") == ref
