"""A cache that never serves another dataset's or an old object's bytes (issue 24), against moto's S3 server.

Every dataset here is written by the test with known ids (dataset A: 0..N-1, dataset B: 500000 + 0..N-1, the same
texts, so both have the same shard names and sizes); the oracle is the set of ids a pass delivers.
"""
from __future__ import annotations

import argparse
import os
import shutil

import pytest

from zephon.formats import open_dataset
from zephon.formats import remote as zr

from s3_server import BUCKET

N = 120
B_BASE = 500_000


def write_ids(out, base: int, hashes=("sha1",), n: int = N, size_limit: int = 1500) -> str:
    """An MDS dataset of ``n`` samples with ids ``base + i``; the texts do not depend on ``base``, so datasets
    with different bases have equal shard names and sizes."""
    pytest.importorskip("streaming")
    from streaming import MDSWriter
    with MDSWriter(out=str(out), columns={"id": "int", "text": "str"}, hashes=list(hashes), size_limit=size_limit) as w:
        for i in range(n):
            w.write({"id": base + i, "text": f"row {i:05d} " + "abc" * (i % 7)})
    return str(out)


def ids(ds) -> list[int]:
    """The ids of one full pass over ``ds``, in shard order."""
    return [int(r["id"]) for s in range(len(ds.shards)) for r in ds.read(s, range(ds.shard_sizes[s]))]


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    """Two datasets with the same shard names and sizes and different ids, with and without index hashes."""
    root = tmp_path_factory.mktemp("trust")
    out = {(b, h): write_ids(root / f"{b}-{bool(h)}", b, h) for b in (0, B_BASE) for h in ((), ("sha1",))}
    for h in ((), ("sha1",)):  # the premise of every test below: only the ids differ
        a, b = out[(0, h)], out[(B_BASE, h)]
        assert sorted(os.listdir(a)) == sorted(os.listdir(b))
        assert all(os.path.getsize(os.path.join(a, f)) == os.path.getsize(os.path.join(b, f))
                   for f in os.listdir(a) if f.startswith("shard."))
    return out


A_IDS = list(range(N))
B_IDS = [B_BASE + i for i in range(N)]


def test_two_datasets_sharing_a_folder_are_refused_naming_both(s3, pair, tmp_path):
    ua = s3.upload_dir(pair[(0, ())], "a")
    ub = s3.upload_dir(pair[(B_BASE, ())], "b")
    local = str(tmp_path / "shared")
    assert ids(open_dataset(ua, local=local)) == A_IDS
    with pytest.raises(zr.RemoteError) as e:  # CacheConflict
        open_dataset(ub, local=local)
    assert type(e.value).__name__ == "CacheConflict"
    msg = str(e.value)
    assert ub in msg and ua in msg and local in msg, msg


def test_cli_one_local_for_several_data_gives_each_its_own_folder(s3, pair, tmp_path):
    from zephon.cli_pipeline import open_datasets as _open_datasets
    from zephon.cli_formats import add_format_args
    ua = s3.upload_dir(pair[(0, ())], "a")
    ub = s3.upload_dir(pair[(B_BASE, ())], "b")
    p = argparse.ArgumentParser()
    add_format_args(p)
    p.add_argument("--data", action="append")
    p.add_argument("--field", default="id")
    p.add_argument("--on-error", default="raise")
    local = str(tmp_path / "one")
    a, b = _open_datasets(p.parse_args(["--data", ua, "--data", ub, "--local", local]))
    assert (ids(a), ids(b)) == (A_IDS, B_IDS)
    a, b = _open_datasets(p.parse_args(["--data", ua, "--data", ub, "--local", str(tmp_path / "x"),
                                        "--local", str(tmp_path / "y")]))
    assert (ids(a), ids(b)) == (A_IDS, B_IDS)
    assert os.path.isfile(tmp_path / "y" / "index.json")


@pytest.mark.parametrize("validate_hash", [None, "sha1"])
def test_a_bucket_rewritten_in_place_with_equal_sizes_is_fetched_again(s3, pair, tmp_path, validate_hash):
    hashes = ("sha1",) if validate_hash else ()
    url = s3.upload_dir(pair[(0, hashes)], "ds")
    local = str(tmp_path / "c")
    assert ids(open_dataset(url, local=local, validate_hash=validate_hash)) == A_IDS
    s3.upload_dir(pair[(B_BASE, hashes)], "ds")  # same keys, same sizes, new bytes
    before = zr.stats()["downloads"]
    assert ids(open_dataset(url, local=local, validate_hash=validate_hash)) == B_IDS
    shards = len([f for f in os.listdir(pair[(0, hashes)]) if f.startswith("shard.")])
    assert zr.stats()["downloads"] - before == shards + 1  # every shard again, and index.json


def test_an_object_rewritten_during_a_pass_is_refused_naming_old_and_new_etag(s3, tmp_path):
    lines = [b'{"id": %d, "text": "t"}\n' % i for i in range(100, 150)]
    url = s3.put("j/a.jsonl", b"".join(lines))
    local = str(tmp_path / "c")
    ds = open_dataset(url, local=local)
    assert [r["id"] for r in ds.read(0, range(50))] == list(range(100, 150))
    s3.put("j/a.jsonl", b"".join(line.replace(b'"id": 1', b'"id": 9') for line in lines))  # same size
    etag_new = s3.client().head_object(Bucket=BUCKET, Key="j/a.jsonl")["ETag"].strip('"')
    os.remove(os.path.join(local, "a.jsonl"))  # evicted: the next read fetches it again
    with pytest.raises(zr.RemoteError) as e:  # ObjectChanged
        list(ds.read(0, range(50)))
    assert type(e.value).__name__ == "ObjectChanged"
    assert str(e.value).startswith(url) and etag_new in str(e.value) and e.value.old != etag_new


def test_validate_hash_checks_a_cached_copy_before_first_use(s3, pair, tmp_path):
    src = pair[(0, ("sha1",))]
    url = s3.upload_dir(src, "v")
    local = str(tmp_path / "c")
    assert ids(open_dataset(url, local=local, validate_hash="sha1")) == A_IDS
    shard = os.path.join(local, "shard.00000.mds")
    st = os.stat(shard)
    with open(shard, "r+b") as f:  # bit rot on disk: same size, other bytes
        f.seek(st.st_size - 8)
        f.write(b"\xff" * 8)
    os.utime(shard, ns=(st.st_atime_ns, st.st_mtime_ns))
    getattr(zr.root, "_VERIFIED", {}).clear()  # what a new process starts with
    before = zr.stats()["downloads"]
    assert ids(open_dataset(url, local=local, validate_hash="sha1")) == A_IDS
    assert zr.stats()["downloads"] - before == 2  # index.json and the damaged shard, nothing else


def test_eviction_never_touches_a_local_dataset_under_the_cache_folder(s3, pair, tmp_path):
    cache = tmp_path / "cache"
    mine = cache / "mine"
    shutil.copytree(pair[(B_BASE, ())], mine)
    before = {f: open(mine / f, "rb").read() for f in os.listdir(mine)}
    src = pair[(0, ())]
    url = s3.upload_dir(src, "r")
    largest = max(os.path.getsize(os.path.join(src, f)) for f in os.listdir(src) if f.startswith("shard."))
    assert ids(open_dataset(url, local=str(cache), cache_limit=2 * largest)) == A_IDS
    assert {f: open(mine / f, "rb").read() for f in os.listdir(mine)} == before
    assert ids(open_dataset(str(mine))) == B_IDS


def test_two_streams_sharing_local_are_refused(s3, pair, tmp_path):
    pytest.importorskip("torch")
    from zephon_streaming import Stream, StreamingDataset
    ua = s3.upload_dir(pair[(0, ())], "a")
    ub = s3.upload_dir(pair[(B_BASE, ())], "b")
    local = str(tmp_path / "shared")
    with pytest.raises(zr.RemoteError) as e:
        StreamingDataset(streams=[Stream(remote=ua, local=local), Stream(remote=ub, local=local)], batch_size=4)
    assert ua in str(e.value) and ub in str(e.value)


def test_a_local_folder_holding_a_dataset_of_its_own_is_warned_about(s3, pair, tmp_path):
    """``local=`` naming a folder where the user wrote a dataset (not downloaded by Zephon): the remote's files of
    the same names replace it, so the first open warns, naming the folder and files; a folder bound before does not
    warn again, and an empty one never does."""
    import warnings

    from zephon.formats import DataWarning

    url = s3.upload_dir(pair[(0, ())], "w")
    local = tmp_path / "mine"
    shutil.copytree(pair[(B_BASE, ())], local)
    with pytest.warns(DataWarning, match=r"already holds files Zephon did not download \(index\.json"):
        ds = open_dataset(url, local=str(local))
    assert ids(ds) == A_IDS  # the remote's bytes, not the folder's
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        open_dataset(url, local=str(local))
        open_dataset(url, local=str(tmp_path / "empty"))
