"""The remote layer under faults and sharing, against a real S3 server (moto) and a misbehaving proxy.

cache_limit at a third of the dataset (a full pass completes, the cache never holds more than the limit, the
global batches equal the unlimited run's), a server stopped mid-pass, responses that hang or crawl, a corrupted
object, a missing one, refused credentials, and two processes sharing one cache directory. Oracles: the local
copy read by the local reader, byte counts and timings measured here.
"""
from __future__ import annotations

import hashlib
import multiprocessing as mp
import os
import threading
import time

import pytest

from zephon.formats import DataError, open_dataset
from zephon.formats import remote as zr

from s3_server import BUCKET, FaultProxy
from test_remote_formats import every_record, write_mds


@pytest.fixture(scope="module")
def mds_dir(tmp_path_factory):
    pytest.importorskip("streaming")
    return write_mds(tmp_path_factory.mktemp("faults") / "mds", n=360, size_limit=2500)


def digest_records(records) -> str:
    return hashlib.sha256(repr(records).encode()).hexdigest()


# -- cache_limit -------------------------------------------------------------------------------------------
def _batches(ds, **kw):
    """Per-step digests of a core Loader pass (threads runner, 2 workers): the global batches."""
    from zephon import Batch, Loader
    L = Loader([ds], [Batch(4)], seed=3, canonical_replicas=4, global_batch_size=16, chunk_size=8, shuffle=True,
               exhaustion="stop", runner="threads", num_workers=2, **kw)
    steps: dict = {}
    try:
        for mb in L:
            steps.setdefault(mb["__step__"], []).append((mb["__lane__"], repr(mb["id"]), repr(mb["text"])))
    finally:
        L.close()
    return {s: digest_records(sorted(v)) for s, v in steps.items()}


def test_cache_limit_at_a_third_completes_a_pass_within_the_limit_with_the_same_batches(s3, mds_dir, tmp_path):
    url = s3.upload_dir(mds_dir, "mds")
    total = sum(os.path.getsize(os.path.join(mds_dir, f)) for f in os.listdir(mds_dir))
    limit = total // 3
    ref = _batches(open_dataset(url, local=str(tmp_path / "unlimited")))
    local = str(tmp_path / "limited")
    ds = open_dataset(url, local=local, cache_limit=limit)
    peak, stop = [0], threading.Event()

    def size(path):
        try:
            return os.path.getsize(path)
        except FileNotFoundError:  # renamed or evicted while the walk ran
            return 0

    def sample():
        while not stop.is_set():
            # shards and their copies in flight (.shard.*.tmp); index.json is metadata, outside the limit
            peak[0] = max(peak[0], sum(size(os.path.join(r, f)) for r, _, fs in os.walk(local) for f in fs
                                       if f.startswith(("shard.", ".shard.", ".scratch."))))
            samples[0] += 1
            time.sleep(0.002)
    samples = [0]
    t = threading.Thread(target=sample)
    before = zr.stats()["downloads"]
    t.start()
    try:
        got = _batches(ds)
    finally:
        stop.set()
        t.join()
    assert got == ref and len(got) > 10
    assert 0 < peak[0] <= limit and samples[0] > 20, (peak[0], limit, samples[0])
    assert zr.stats()["downloads"] - before >= len(ds.shards)  # every shard was fetched ...
    assert len([f for f in os.listdir(local) if f.startswith("shard.")]) < len(ds.shards)  # ... and some evicted


@pytest.mark.parametrize("compression", [None, "zstd"])
def test_every_shard_byte_on_disk_counts_against_the_limit_when_the_manifest_changes(s3, tmp_path, monkeypatch,
                                                                                    compression):
    # a copy renamed into place before the manifest owns it counts nowhere (neither a temporary copy nor an owned
    # shard): eviction then makes too little room while it is so. Oracle: the bytes of shard files and their
    # temporary copies in the folder, summed by the test, at each manifest change.
    src = write_mds(tmp_path / "src", n=200, compression=compression, size_limit=2500)
    url = s3.upload_dir(src, f"owned-{compression}")
    local = tmp_path / "c"
    ds = open_dataset(url, local=str(local), cache_limit=10**9, read_ahead=0, keep_zip=compression is not None)
    seen = []
    forget_all = zr.LocalCache.forget_all

    def checked(cache, entries):
        on_disk = sum(e.stat().st_size for e in os.scandir(local) if e.is_file()
                      and e.name.startswith(("shard.", ".shard.", ".scratch.")))
        seen.append((sorted(entries), cache.usage(), on_disk))
        return forget_all(cache, entries)
    monkeypatch.setattr(zr.LocalCache, "forget_all", checked)
    assert [int(r["id"]) for r in every_record(ds)] == list(range(200))
    assert len(seen) >= len(ds.shards) > 2
    assert all(usage == on_disk for _, usage, on_disk in seen), seen


def test_a_shard_larger_than_cache_limit_is_refused_by_name(s3, mds_dir, tmp_path):
    url = s3.upload_dir(mds_dir, "mds")
    ds = open_dataset(url, local=str(tmp_path / "c"), cache_limit=1000)
    with pytest.raises(zr.CacheFull, match=r"shard.00000.mds.*cache_limit=1000"):
        ds.read(0, [0])


# -- faults ------------------------------------------------------------------------------------------------
def test_server_stopped_mid_pass_fails_clearly_within_retries_times_timeout(s3, mds_dir, tmp_path, monkeypatch):
    url = s3.upload_dir(mds_dir, "mds")
    second = s3.second()
    monkeypatch.setenv("S3_ENDPOINT_URL", second.endpoint)
    ds = open_dataset(url, local=str(tmp_path / "c"), download_retry=2, download_timeout=2)
    assert ds.read(0, [0, 1])
    second.stop()
    t0 = time.monotonic()
    with pytest.raises(zr.RemoteError) as e:
        ds.read(3, [0])
    took = time.monotonic() - t0
    msg = str(e.value)
    assert msg.startswith(f"s3://{BUCKET}/mds/shard.00003.mds: download failed after 3 attempt(s)"), msg
    assert "download_retry=2" in msg and "last cause:" in msg and "Connect" in msg
    assert took < 3 * 2 + 2, took


def test_a_server_that_stops_answering_hits_download_timeout(s3, mds_dir, tmp_path, monkeypatch):
    url = s3.upload_dir(mds_dir, "mds")
    ds = open_dataset(url, local=str(tmp_path / "c"), download_retry=1, download_timeout=1)
    proxy = FaultProxy(s3.endpoint, mode="hang")
    monkeypatch.setenv("S3_ENDPOINT_URL", proxy.endpoint)
    try:
        t0 = time.monotonic()
        with pytest.raises(zr.RemoteTimeout, match=r"shard.00000.mds: download failed after 2 attempt"):
            ds.read(0, [0])
        took = time.monotonic() - t0
    finally:
        proxy.close()
    assert 1.5 < took < 2 * 1 + 1 + 2, took  # two attempts of ~1 s plus the backoff, never a hang


def test_slow_responses_are_waited_for_and_give_the_same_samples(s3, mds_dir, tmp_path, monkeypatch):
    url = s3.upload_dir(mds_dir, "mds")
    proxy = FaultProxy(s3.endpoint, mode="slow", delay=0.05)
    monkeypatch.setenv("S3_ENDPOINT_URL", proxy.endpoint)
    try:
        ds = open_dataset(url, local=str(tmp_path / "c"), download_timeout=10, validate_hash="sha1")
        assert every_record(ds) == every_record(open_dataset(mds_dir))
    finally:
        proxy.close()


def test_a_corrupted_object_fails_hash_validation_naming_the_shard(s3, mds_dir, tmp_path):
    url = s3.upload_dir(mds_dir, "mds")
    data = bytearray(open(os.path.join(mds_dir, "shard.00002.mds"), "rb").read())
    data[-3] ^= 0xFF
    s3.put("mds/shard.00002.mds", bytes(data))
    local = tmp_path / "c"
    ds = open_dataset(url, local=str(local), validate_hash="sha1")
    with pytest.raises(DataError, match=r"mds/shard.00002.mds \(shard 2\): sha1 checksum mismatch") as e:
        ds.read(2, [0])
    assert "corrupted" in str(e.value)
    assert not os.path.exists(local / "shard.00002.mds")  # never entered the cache
    assert ds.read(1, [0]) == open_dataset(mds_dir).read(1, [0])


def test_a_missing_object_names_it_and_the_credentials_source(s3, mds_dir, tmp_path):
    url = s3.upload_dir(mds_dir, "mds")
    s3.client().delete_object(Bucket=BUCKET, Key="mds/shard.00001.mds")
    ds = open_dataset(url, local=str(tmp_path / "c"))
    with pytest.raises(zr.ObjectMissing) as e:
        ds.read(1, [0])
    msg = str(e.value)
    assert msg.startswith(f"s3://{BUCKET}/mds/shard.00001.mds: download failed: object not found"), msg
    assert "environment variables AWS_ACCESS_KEY_ID" in msg and "$S3_ENDPOINT_URL" in msg
    with pytest.raises(zr.ObjectMissing, match="nothing.jsonl"):
        open_dataset(f"s3://{BUCKET}/nothing.jsonl")


def test_refused_credentials_name_the_object_and_source_never_the_secret(s3, mds_dir, tmp_path, monkeypatch):
    from moto.core.authorization import enable_iam_authentication

    url = s3.upload_dir(mds_dir, "mds")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIAWRONGKEY1234")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "s3cr3t-never-printed")
    with enable_iam_authentication():
        with pytest.raises(zr.AccessDenied) as e:
            open_dataset(url, local=str(tmp_path / "c"), format="mds")
    msg = str(e.value)
    assert msg.startswith(f"s3://{BUCKET}/mds/index.json: download failed: access denied"), msg
    assert "environment variables AWS_ACCESS_KEY_ID" in msg and "...1234" in msg
    assert "s3cr3t" not in msg and "AKIAWRONGKEY" not in msg


# -- one cache, two processes ------------------------------------------------------------------------------
def _read_all(url, local, go, out):
    go.wait(30)
    ds = open_dataset(url, local=local)
    out.put((digest_records(every_record(ds)), zr.stats()["downloads"]))


def test_two_processes_share_one_cache_without_double_downloads(s3, mds_dir, tmp_path):
    url = s3.upload_dir(mds_dir, "mds")
    local = str(tmp_path / "shared")
    ctx = mp.get_context("spawn")
    go, out = ctx.Event(), ctx.Queue()
    procs = [ctx.Process(target=_read_all, args=(url, local, go, out)) for _ in range(2)]
    for p in procs:
        p.start()
    go.set()
    results = [out.get(timeout=120) for _ in procs]
    for p in procs:
        p.join(30)
    want = digest_records(every_record(open_dataset(mds_dir)))
    assert [d for d, _ in results] == [want, want]
    n = len(open_dataset(mds_dir).shards)
    assert sum(k for _, k in results) == n + 2  # each shard once between them, plus each one's index.json
    assert not [f for f in os.listdir(local) if f.endswith(".tmp")]
