"""zephon.formats at object-storage URLs, against a real S3-compatible server (moto, tests/s3_server.py).

Oracles: the same data read from its local directory by the local readers (themselves checked against
streaming / Energon in test_mds.py and test_energon_format.py), and counts made here (objects uploaded, files
in the cache). Every test starts from an empty bucket and an empty cache.
"""
from __future__ import annotations

import gzip
import json
import os

import pytest

from zephon.formats import DataError, open_dataset
from zephon.formats import remote as zr

from s3_server import BUCKET


def write_mds(out, n=240, compression=None, size_limit=3000):
    """An MDSWriter dataset of ``n`` samples (int id, str text), several shards, sha1 + xxh64 recorded."""
    from streaming import MDSWriter
    with MDSWriter(out=str(out), columns={"id": "int", "text": "str"}, compression=compression,
                   hashes=["sha1", "xxh64"], size_limit=size_limit) as w:
        for i in range(n):
            w.write({"id": i, "text": f"sample {i} " + "xyz" * (i % 13)})
    return str(out)


def every_record(ds):
    return [r for s in range(len(ds.shards)) for r in ds.read(s, range(ds.shard_sizes[s]))]


def shard_files(d):
    return sorted(f for f in os.listdir(d) if f.startswith("shard."))


@pytest.fixture(scope="module")
def mds_dirs(tmp_path_factory):
    pytest.importorskip("streaming")
    root = tmp_path_factory.mktemp("remote_mds")
    return {c: write_mds(root / str(c), compression=c) for c in (None, "zstd")}


@pytest.fixture(scope="module")
def file_dir(tmp_path_factory):
    import pyarrow as pa
    import pyarrow.parquet as pq
    import zstandard

    d = tmp_path_factory.mktemp("remote_files")
    rows = [{"text": f"document {i}: " + "words " * (i % 9), "id": i} for i in range(300)]
    raw = "".join(json.dumps(r) + "\n" for r in rows).encode()
    (d / "a.jsonl").write_bytes(raw)
    (d / "b.jsonl.zst").write_bytes(zstandard.ZstdCompressor().compress(raw))
    (d / "c.jsonl.gz").write_bytes(gzip.compress(raw))
    pq.write_table(pa.Table.from_pylist(rows), d / "d.parquet", row_group_size=32)
    (d / ".hidden.jsonl").write_bytes(b'{"text": "never read"}\n')
    return str(d)


# -- MDS ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("compression,keep_zip", [(None, False), ("zstd", False), ("zstd", True)])
def test_mds_at_s3_equals_the_local_copy_and_a_warm_cache_downloads_nothing(s3, mds_dirs, tmp_path, compression,
                                                                            keep_zip):
    local_dir = mds_dirs[compression]
    url = s3.upload_dir(local_dir, "mds")
    local = tmp_path / "cache"
    before = zr.stats()["downloads"]
    ds = open_dataset(url, local=str(local), validate_hash="sha1", keep_zip=keep_zip)
    ref = open_dataset(local_dir)
    assert every_record(ds) == every_record(ref)
    # checkpoints move between a bucket and a local copy (the name is the folder's unless given)
    assert {**ds.fingerprint(), "name": 0} == {**ref.fingerprint(), "name": 0}
    n = len(ref.shards)
    assert zr.stats()["downloads"] - before == n + 1  # index.json + every shard once
    assert ds.shards[0].path.startswith(f"s3://{BUCKET}/mds/shard.00000.mds")
    # Mosaic's layout: raw shards decompressed into local, the compressed copy only with keep_zip
    names = shard_files(local)
    assert sum(f.endswith(".mds") for f in names) == n
    assert sum(f.endswith(".zstd") for f in names) == (n if keep_zip else 0)
    before = zr.stats()["downloads"]
    again = open_dataset(url, local=str(local), validate_hash="xxh64")
    assert every_record(again) == every_record(ref)
    assert zr.stats()["downloads"] - before == 1  # index.json only


def test_predownload_fetches_ahead_in_index_order_without_evicting(s3, mds_dirs, tmp_path):
    import time

    url = s3.upload_dir(mds_dirs["zstd"], "mds")
    ref = open_dataset(mds_dirs["zstd"])
    local = tmp_path / "ahead"
    ds = open_dataset(url, local=str(local), predownload=ref.num_samples)
    ds.read(0, [0])
    deadline = time.monotonic() + 30
    while len(shard_files(local)) < len(ref.shards) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert len(shard_files(local)) == len(ref.shards)  # every shard fetched ahead of any read
    raw, zipped = max(m.raw.bytes for m in ref.metas), max(m.zip.bytes for m in ref.metas)
    small = tmp_path / "small"
    ds = open_dataset(url, local=str(small), predownload=ref.num_samples, cache_limit=2 * raw + zipped)
    ds.read(0, [0])
    time.sleep(1.0)
    assert 0 < len(shard_files(small)) < len(ref.shards)  # stopped where the next one would need an eviction


def test_mds_split_and_default_local_and_detection(s3, mds_dirs, tmp_path):
    s3.upload_dir(mds_dirs[None], "root/train")
    ds = open_dataset(f"s3://{BUCKET}/root", split="train", local=str(tmp_path / "l"))
    assert os.path.isfile(tmp_path / "l" / "train" / "index.json")  # <local>/<split>, as streaming does
    assert type(ds).__name__ == "MdsDataset" and ds.name == "root/train"
    auto = open_dataset(f"s3://{BUCKET}/root/train")  # detected by its index.json; cache under ZEPHON_CACHE_DIR
    assert every_record(auto) == every_record(open_dataset(mds_dirs[None]))
    assert os.environ["ZEPHON_CACHE_DIR"] in auto.remote.root.local
    with pytest.raises(DataError, match="root/nope/index.json: no index.json at this URL"):
        open_dataset(f"s3://{BUCKET}/root", split="nope", format="mds")


# -- JSONL and Parquet ---------------------------------------------------------------------------------
def test_files_at_s3_equal_the_local_copies(s3, file_dir, tmp_path):
    url = s3.upload_dir(file_dir, "files")
    cache = str(tmp_path / "cache")
    ds = open_dataset(url, local=cache)
    assert [os.path.basename(s.path) for s in ds.shards] == ["a.jsonl", "b.jsonl.zst", "c.jsonl.gz", "d.parquet"]
    ref = open_dataset(file_dir)
    assert ds.fingerprint()["shards"] == ref.fingerprint()["shards"]
    # every order of access, repeats included
    for s in range(4):
        idx = list(range(ds.shard_sizes[s]))[::-3] + [0, 0]
        assert ds.read(s, idx) == ref.read(s, idx)
    single = open_dataset(f"{url}/b.jsonl.zst", local=cache)
    assert single.name == "b" and every_record(single) == every_record(open_dataset(f"{file_dir}/b.jsonl.zst"))
    globbed = open_dataset(f"{url}/*.jsonl*", local=cache)
    assert len(globbed.shards) == 3
    assert open_dataset(f"{url}/d.parquet", columns=["id"]).read(0, [5]) == [{"id": 5}]


def test_parquet_is_read_by_range_and_jsonl_index_is_built_once(s3, file_dir, tmp_path, monkeypatch):
    from zephon.formats import jsonl

    url = s3.upload_dir(file_dir, "files")
    cache = str(tmp_path / "cache")
    before = zr.stats()
    ds = open_dataset(f"{url}/d.parquet", local=cache)
    every_record(ds)
    after = zr.stats()
    assert after["downloads"] == before["downloads"] and after["range_reads"] > before["range_reads"]
    assert not os.path.exists(os.path.join(cache, "d.parquet"))  # never downloaded whole

    builds = []
    real = jsonl.build_line_index
    monkeypatch.setattr(jsonl, "build_line_index", lambda blocks: builds.append(1) or real(blocks))
    open_dataset(f"{url}/a.jsonl", local=cache)
    assert len(builds) == 1 and os.path.isfile(os.path.join(cache, ".a.jsonl.zephon-idx.npz"))
    os.unlink(os.path.join(cache, "a.jsonl"))  # as eviction would: fetched again, index still valid
    again = open_dataset(f"{url}/a.jsonl", local=cache)
    assert every_record(again) == every_record(open_dataset(f"{file_dir}/a.jsonl"))
    assert len(builds) == 1


def test_msc_urls_read_through_the_multi_storage_client(s3, file_dir, mds_dirs, tmp_path, monkeypatch):
    pytest.importorskip("multistorageclient")
    s3.upload_dir(file_dir, "files")
    s3.upload_dir(mds_dirs["zstd"], "mds")
    cfg = tmp_path / "msc.yaml"
    cfg.write_text("\n".join([
        "profiles:", "  zt:", "    storage_provider:", "      type: s3", "      options:",
        f"        base_path: {BUCKET}", f"        endpoint_url: {s3.endpoint}", "        region_name: us-east-1",
        "    credentials_provider:", "      type: S3Credentials", "      options:", "        access_key: testing",
        "        secret_key: testing", ""]))
    monkeypatch.setenv("MSC_CONFIG", str(cfg))
    monkeypatch.setenv("S3_ENDPOINT_URL", "http://127.0.0.1:9")  # nothing there: MSC must use its own config
    assert every_record(open_dataset("msc://zt/files/b.jsonl.zst")) == every_record(open_dataset(f"{file_dir}/"
                                                                                                 f"b.jsonl.zst"))
    ds = open_dataset("msc://zt/mds", validate_hash="sha1", local=str(tmp_path / "c"))
    assert every_record(ds) == every_record(open_dataset(mds_dirs["zstd"]))


def test_any_fsspec_protocol_is_a_backend(file_dir):
    fsspec = pytest.importorskip("fsspec")
    fs = fsspec.filesystem("memory")
    for name in ("a.jsonl", "d.parquet"):
        fs.pipe(f"memory://zephon-bucket/f/{name}", open(os.path.join(file_dir, name), "rb").read())
    zr.FSSPEC_SCHEMES.add("memory")
    try:
        ds = open_dataset("memory://zephon-bucket/f")
        assert every_record(ds) == every_record(open_dataset([f"{file_dir}/a.jsonl", f"{file_dir}/d.parquet"]))
    finally:
        zr.FSSPEC_SCHEMES.discard("memory")


# -- Energon ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("whole", [True, False])
def test_energon_at_s3_equals_the_local_copy_small_tars_whole_large_by_range(s3, tmp_path, monkeypatch, whole):
    pytest.importorskip("megatron.energon")
    import energon_data as E

    from zephon.formats.energon import remote as er
    if not whole:
        monkeypatch.setattr(er, "WHOLE_TAR", 0)  # every tar is "large": read by range
    root, _expected = E.text_dataset(str(tmp_path / "e"))
    url = s3.upload_dir(root, "text")  # same folder name: same dataset name
    cache = tmp_path / "cache"
    before = zr.stats()
    for split in ("train", "val"):
        ds = open_dataset(url, split_part=split, local=str(cache))
        ref = open_dataset(root, split_part=split)
        assert ds.fingerprint() == ref.fingerprint()
        got, want = every_record(ds), every_record(ref)
        assert got == want
        assert ds.read(0, [3, 0, 3]) == ref.read(0, [3, 0, 3])
    after = zr.stats()
    tars = sorted(f for f in os.listdir(root) if f.endswith(".tar"))
    cached = sorted(f for f in os.listdir(cache) if f.endswith(".tar"))
    if whole:  # one GET per tar read (the train and val splits' tars), no range reads
        assert cached and set(cached) <= set(tars) and after["range_reads"] == before["range_reads"]
    else:
        assert after["range_reads"] > before["range_reads"] and not cached
    assert [f for f in os.listdir(cache) if f.endswith(".tar.idx")]


# -- small pieces ------------------------------------------------------------------------------------------
def test_url_helpers():
    assert zr.parse_size("10gb") == 10 * 1000**3 and zr.parse_size("2KiB") == 2048 and zr.parse_size(7) == 7
    with pytest.raises(ValueError):
        zr.parse_size("lots")
    assert zr.urls.glob_match("s3://b/d/x/y.jsonl", "s3://b/d/**/*.jsonl")
    assert zr.urls.glob_match("s3://b/d/y.jsonl", "s3://b/d/**/*.jsonl")
    assert not zr.urls.glob_match("s3://b/d/x/y.jsonl", "s3://b/d/*.jsonl")
    assert zr.evictable("train/shard.00001.mds") and not zr.evictable("train/index.json")
    assert not zr.evictable(".nv-meta/index.sqlite") and not zr.evictable("data-000.tar.idx")
    assert zr.is_remote("s3://b/k") and zr.is_remote("msc://p/k") and not zr.is_remote("/tmp/x")


def test_endpoint_variables_in_their_order(monkeypatch):
    from zephon.formats.remote.credentials import s3_endpoint
    for v in ("S3_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL"):
        monkeypatch.delenv(v, raising=False)
    assert s3_endpoint() == (None, "boto3's default")
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://c")
    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", "http://b")
    assert s3_endpoint() == ("http://b", "$AWS_ENDPOINT_URL_S3")
    monkeypatch.setenv("S3_ENDPOINT_URL", "http://a")
    assert s3_endpoint() == ("http://a", "$S3_ENDPOINT_URL")
