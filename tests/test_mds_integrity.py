"""MDS shard integrity: sample offsets against the shard's size, and shards past 4 GiB.

``streaming.MDSWriter`` stores sample offsets as uint32, so in a shard past 4 GiB they wrap. The big shards
here are sparse files built byte by byte the way MDSWriter lays a shard out (the builder is checked against
the real MDSWriter on a small shard); the oracle of every read is the bytes the test wrote, and the huge
middle of a shard is a hole that is never read.
"""
from __future__ import annotations

import json
import os
import struct

import numpy as np
import pytest

from zephon.formats import DataError, open_dataset

from helpers import count_preads
from zephon.formats.mds import ShardRefused, sample_offsets, unwrap_offsets

COLUMNS = {"id": "int", "payload": "bytes"}  # MDSWriter sorts names: "id" (fixed 8 bytes), "payload" (variable)
BASENAME = "shard.00000.mds"
GiB4 = 1 << 32


def _config() -> bytes:
    # MDSWriter.get_config() as it writes it into every shard: json.dumps(obj, sort_keys=True)
    return json.dumps({"column_encodings": ["int", "bytes"], "column_names": ["id", "payload"],
                       "column_sizes": [8, None], "compression": None, "format": "mds", "hashes": [],
                       "size_limit": None, "version": 2}, sort_keys=True).encode("utf-8")


def _sample_size(payload) -> int:
    return 4 + 8 + (len(payload) if isinstance(payload, bytes) else payload)


def build_shard(d, samples) -> list[int]:
    """Write ``d/shard.00000.mds`` and ``d/index.json`` as MDSWriter(columns=COLUMNS, size_limit=None) would.

    samples: ``[(id, payload)]``; payload is bytes, or an int: that many zero bytes left as a hole (sparse).
    Returns the true offsets (Python ints, shape n + 1); the file stores each modulo 2**32 as uint32.
    """
    n, config = len(samples), _config()
    offsets = [4 + 4 * (n + 1) + len(config)]
    for _, payload in samples:
        offsets.append(offsets[-1] + _sample_size(payload))
    os.makedirs(d, exist_ok=True)
    path = os.path.join(d, BASENAME)
    with open(path, "wb") as f:
        f.write(struct.pack("<I", n))
        f.write(struct.pack(f"<{n + 1}I", *(o % GiB4 for o in offsets)))  # MDSWriter: cumsum().astype(uint32)
        f.write(config)
        for (i, payload), at in zip(samples, offsets):
            size = len(payload) if isinstance(payload, bytes) else payload
            f.seek(at)
            f.write(struct.pack("<I", size) + struct.pack("<q", i))  # sizes of variable columns, then "id"
            if isinstance(payload, bytes):
                f.write(payload)
        f.truncate(offsets[-1])  # a hole at the end is still part of the file
    entry = {"column_encodings": ["int", "bytes"], "column_names": ["id", "payload"], "column_sizes": [8, None],
             "compression": None, "format": "mds", "hashes": [], "samples": n, "size_limit": None, "version": 2,
             "raw_data": {"basename": BASENAME, "bytes": offsets[-1], "hashes": {}}, "zip_data": None}
    with open(os.path.join(d, "index.json"), "w") as f:
        json.dump({"version": 2, "shards": [entry]}, f, sort_keys=True)
    return offsets


def _stored_offsets(path, n) -> list[int]:
    with open(path, "rb") as f:
        f.seek(4)
        return list(struct.unpack(f"<{n + 1}I", f.read(4 * (n + 1))))


def _set_stored_offset(path, k, value) -> None:
    with open(path, "r+b") as f:
        f.seek(4 + 4 * k)
        f.write(struct.pack("<I", value))


def _records(samples, ids):
    return [{"id": i, "payload": samples[i][1]} for i in ids]


def test_builder_lays_out_a_shard_exactly_as_mdswriter(tmp_path):
    pytest.importorskip("streaming")
    from streaming import MDSWriter
    samples = [(i, bytes(range(i, 3 * i + 5))) for i in range(6)]
    ref = tmp_path / "ref"
    with MDSWriter(out=str(ref), columns=COLUMNS, size_limit=None) as w:
        for i, p in samples:
            w.write({"id": i, "payload": p})
    build_shard(tmp_path / "ours", samples)
    assert (tmp_path / "ours" / BASENAME).read_bytes() == (ref / BASENAME).read_bytes()
    assert json.loads((tmp_path / "ours" / "index.json").read_text()) == json.loads((ref / "index.json").read_text())


# ---------------------------------------------------------------- offsets, without files


def test_unwrap_recovers_offsets_past_8_gib():
    true = [40, 1000, GiB4 - 8, GiB4 + 16, 2 * GiB4 - 1, 2 * GiB4 + 5, 3 * GiB4 + 3]  # every gap < 4 GiB
    stored = np.array([t % GiB4 for t in true], dtype=np.uint32)
    assert unwrap_offsets(stored).tolist() == true
    off, ok = sample_offsets(stored, shard_size=true[-1], indexed_size=true[-1], header_end=32)
    assert off.tolist() == true and ok.all()
    for size in (true[-1] + 1, true[-1] - 1, true[-1] - GiB4):  # a size the offsets do not end at
        with pytest.raises(ShardRefused, match="past 4 GiB"):
            sample_offsets(stored, shard_size=size, indexed_size=true[-1], header_end=32)
    with pytest.raises(ShardRefused, match="inside the header"):
        sample_offsets(stored, shard_size=true[-1], indexed_size=true[-1], header_end=41)
    # a sample of 4 GiB or more (several columns) leaves no decrease: the size check still refuses it
    true = [40, 1000, GiB4 + 1005]
    with pytest.raises(ShardRefused, match="past 4 GiB"):
        sample_offsets(np.array([t % GiB4 for t in true], np.uint32), shard_size=true[-1], indexed_size=true[-1],
                       header_end=32)


def test_small_shard_offsets_distrust_only_the_samples_they_bound():
    stored = np.array([20, 30, 25, 50, 60], dtype=np.uint32)  # 30 > 25: offset 1 or 2 is damaged
    off, ok = sample_offsets(stored, shard_size=60, indexed_size=60, header_end=20)
    assert off.tolist() == [20, 30, 25, 50, 60] and ok.tolist() == [False, False, False, True]
    _, ok = sample_offsets(np.array([20, 30, 90, 50, 60], np.uint32), shard_size=60, indexed_size=60, header_end=20)
    assert ok.tolist() == [True, False, False, True]  # 90 is outside the shard: only its two samples
    with pytest.raises(ShardRefused, match="10 bytes after the last sample"):
        sample_offsets(np.array([20, 30, 50], np.uint32), shard_size=60, indexed_size=60, header_end=20)
    _, ok = sample_offsets(np.array([20, 30, 70], np.uint32), shard_size=60, indexed_size=70, header_end=20)
    assert ok.tolist() == [True, False]  # truncated: what is still there is read


# ---------------------------------------------------------------- small shards written by MDSWriter


@pytest.fixture
def small(tmp_path):
    pytest.importorskip("streaming")
    from streaming import MDSWriter
    samples = [(i, f"sample {i} ".encode() * (i + 1)) for i in range(8)]
    with MDSWriter(out=str(tmp_path / "small"), columns=COLUMNS, size_limit=None) as w:
        for i, p in samples:
            w.write({"id": i, "payload": p})
    return str(tmp_path / "small"), os.path.join(tmp_path / "small", BASENAME), samples


def test_offsets_not_increasing_refuse_the_samples_they_bound(small):
    d, path, samples = small
    stored = _stored_offsets(path, len(samples))
    _set_stored_offset(path, 3, stored[2] - 1)  # offsets 2 and 3 now decrease, both inside the shard
    with pytest.raises(DataError) as e:
        open_dataset(d).read(0, [2])
    assert (e.value.path, e.value.shard, e.value.sample) == (path, 0, 2) and "not increasing" in str(e.value)
    recs = open_dataset(d, on_error="skip").read(0, list(range(8)))
    for k in (1, 2, 3):  # bounded by offset 2 or 3
        assert "not increasing" in recs[k]["__error__"] and f"(shard 0, sample {k})" in recs[k]["__error__"]
    assert [recs[k] for k in (0, 4, 5, 6, 7)] == _records(samples, (0, 4, 5, 6, 7))


def test_last_offset_before_the_end_refuses_the_shard(small):
    d, path, samples = small
    with open(path, "ab") as f:
        f.write(b"\0" * 7)
    with pytest.raises(DataError) as e:
        open_dataset(d).read(0, [0])
    assert (e.value.path, e.value.shard) == (path, 0) and "7 bytes after the last sample" in str(e.value)
    recs = open_dataset(d, on_error="skip").read(0, [0, 7])
    assert all("bytes after the last sample" in r["__error__"] for r in recs)


def test_last_offset_past_the_end_refuses_the_last_sample(small):
    d, path, samples = small
    _set_stored_offset(path, 8, os.path.getsize(path) + 10)
    ds = open_dataset(d, on_error="skip")
    recs = ds.read(0, list(range(8)))
    assert "offsets out of range" in recs[7]["__error__"] and "(shard 0, sample 7)" in recs[7]["__error__"]
    assert recs[:7] == _records(samples, range(7))


# ---------------------------------------------------------------- a shard past 4 GiB (sparse)


def _require_sparse(d) -> None:
    """Skip unless ``d`` can hold a file past 4 GiB that takes (almost) no disk."""
    probe = os.path.join(d, "sparse-probe")
    try:
        with open(probe, "wb") as f:
            f.seek(GiB4 + 4096)
            f.write(b"x")
        blocks = getattr(os.stat(probe), "st_blocks", None)
    except (OSError, OverflowError) as e:
        pytest.skip(f"this filesystem cannot hold a file past 4 GiB: {e}")
    finally:
        if os.path.exists(probe):
            os.remove(probe)
    if blocks is None or blocks * 512 > (64 << 20):
        pytest.skip("this filesystem has no sparse files (a 4 GiB shard would take 4 GiB of disk)")


@pytest.fixture
def big(tmp_path):
    """A 7-sample shard of ~4.3 GB: samples 0, 1 at the start, 2 and 3 holes of ~2 GiB each, sample 4
    straddling the 4 GiB mark (its stored end offset wraps below its start), 5 and 6 past it."""
    _require_sparse(str(tmp_path))
    d = str(tmp_path / "big")
    n = 7
    head = 4 + 4 * (n + 1) + len(_config())
    first = [(0, b"the first sample " * 3), (1, b"second")]
    hole2 = 1 << 31
    before4 = head + sum(_sample_size(p) for _, p in first) + _sample_size(hole2)
    hole3 = (GiB4 - 10) - before4 - 12  # sample 4 starts 10 bytes before the 4 GiB mark
    samples = first + [(2, hole2), (3, hole3), (4, b"straddles the 4 GiB mark"), (5, b"after the mark"),
                       (6, b"the last sample" * 4)]
    offsets = build_shard(d, samples)
    assert offsets[4] == GiB4 - 10 and offsets[5] > GiB4 and offsets[-1] > GiB4
    stored = _stored_offsets(os.path.join(d, BASENAME), n)
    assert stored[5] < stored[4] and stored[:5] == sorted(stored[:5])  # one wrap, between offsets 4 and 5
    assert os.stat(os.path.join(d, BASENAME)).st_blocks * 512 < (64 << 20)  # sparse: the holes cost nothing
    return d, os.path.join(d, BASENAME), samples, offsets


def test_shard_past_4_gib_reads_exactly_and_reads_no_hole(big, monkeypatch):
    d, path, samples, offsets = big
    ds = open_dataset(d)
    assert ds.shard_sizes == [7] and ds.shards[0].size_bytes == offsets[-1]
    read = count_preads(monkeypatch)
    ids = [6, 0, 4, 1, 5, 4]
    assert ds.read(0, ids) == _records(samples, ids)
    assert sum(read) < 4096  # the header and five small samples; nothing of the 4 GiB of holes
    assert ds._reader(0).offsets.tolist() == offsets  # every offset recovered, the holes' too


def _refused(d, path):
    """Assert the shard is refused as a whole, naming file and shard, in both error modes; return the message."""
    with pytest.raises(DataError) as e:
        open_dataset(d).read(0, [5])
    assert (e.value.path, e.value.shard) == (path, 0) and "bad offsets" in str(e.value)
    recs = open_dataset(d, on_error="skip").read(0, [0, 5, 6])
    assert all(r.keys() == {"__error__"} and "bad offsets" in r["__error__"] for r in recs)
    assert [f"(shard 0, sample {k})" in r["__error__"] for k, r in zip((0, 5, 6), recs)] == [True] * 3
    return str(e.value)


def test_shard_past_4_gib_longer_than_its_offsets_is_refused(big):
    d, path, _, offsets = big
    os.truncate(path, offsets[-1] + 1)
    assert "past 4 GiB" in _refused(d, path)


def test_shard_past_4_gib_truncated_below_4_gib_is_refused(big):
    d, path, _, offsets = big
    os.truncate(path, GiB4 - 100)  # sample 0 is still there, but the header no longer describes this file
    msg = _refused(d, path)
    assert f"index.json: {offsets[-1]}" in msg


def test_shard_past_4_gib_with_a_decrease_that_is_not_a_wrap_is_refused(big):
    d, path, _, offsets = big
    stored = _stored_offsets(path, 7)
    _set_stored_offset(path, 2, stored[1] - 1)  # unwraps to 4 GiB more than the file holds
    assert "past 4 GiB" in _refused(d, path)


def test_shard_past_4_gib_with_a_damaged_last_offset_is_refused(big):
    d, path, _, offsets = big
    stored = _stored_offsets(path, 7)
    _set_stored_offset(path, 7, stored[7] - 1)  # the last offset one byte short of the file's size
    assert "past 4 GiB" in _refused(d, path)


# ---------------------------------------------------------------- index.json sizes against the files (real MDSWriter)


def _mds_with_lying_size(tmp_path, field, compression=None):
    """Two shards by MDSWriter, then index.json's ``field.bytes`` of shard 1 raised by 100; returns (dir, path,
    true size, lie)."""
    pytest.importorskip("streaming")
    from streaming import MDSWriter
    d = str(tmp_path / "mds")
    with MDSWriter(out=d, columns={"id": "int", "payload": "bytes"}, size_limit=2000, compression=compression) as w:
        for i in range(40):
            w.write({"id": i, "payload": bytes(range(i, i + 60))})
    with open(os.path.join(d, "index.json")) as f:
        index = json.load(f)
    entry = index["shards"][1][field]
    path = os.path.join(d, entry["basename"])
    true = os.path.getsize(path)
    assert entry["bytes"] == true and len(index["shards"]) > 1
    entry["bytes"] = true + 100
    with open(os.path.join(d, "index.json"), "w") as f:
        json.dump(index, f)
    return d, path, true, true + 100


@pytest.mark.parametrize("field, compression", [("raw_data", None), ("zip_data", "zstd")])
def test_index_size_that_lies_refuses_the_local_shard(tmp_path, field, compression):
    # over S3 the download of such a shard is refused (fewer bytes than index.json says): locally too
    d, path, true, lie = _mds_with_lying_size(tmp_path, field, compression)
    ds = open_dataset(d, cache_dir=str(tmp_path / "cache"))
    assert ds.read(0, [0])[0]["id"] == 0  # the other shard reads
    with pytest.raises(DataError) as e:
        ds.read(1, [0])
    msg = str(e.value)
    assert (e.value.path, e.value.shard) == (path, 1)
    assert f"{field}.bytes says {lie:,} bytes, the file has {true:,}" in msg
    recs = open_dataset(d, on_error="skip", cache_dir=str(tmp_path / "cache2")).read(1, [0, 1])
    assert all(f"{field}.bytes says {lie:,}" in r["__error__"] for r in recs)
