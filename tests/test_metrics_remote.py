"""``Loader.metrics()["remote"]``: cache misses, hits and bytes downloaded while reading an MDS dataset from a real
S3-compatible server (moto, tests/s3_server.py), counted against the requests the server was sent (a pass-through
proxy's log of request lines) and the shard files' sizes on disk; a second pass over the same cache downloads nothing
and hits. With the processes runner the workers' downloads reach the parent's metrics."""
from __future__ import annotations

import os

import pytest

from zephon import Batch, Loader, open_dataset

from s3_server import FaultProxy
from test_remote_formats import shard_files, write_mds


@pytest.mark.parametrize("runner", ["threads", "processes"])
def test_misses_and_bytes_downloaded_then_a_second_pass_only_hits(s3, tmp_path, monkeypatch, runner):
    pytest.importorskip("streaming")
    local_dir = write_mds(tmp_path / "mds", n=160)
    url = s3.upload_dir(local_dir, "mds")
    shards = shard_files(local_dir)
    sizes = sum(os.path.getsize(os.path.join(local_dir, f)) for f in shards)
    assert len(shards) >= 3
    proxy = FaultProxy(s3.endpoint)  # every request line the server is sent, logged on the way
    monkeypatch.setenv("S3_ENDPOINT_URL", proxy.endpoint)
    cache = str(tmp_path / "cache")

    def one_pass():
        ds = open_dataset(url, local=cache)  # index.json: before the loader, so not in its metrics
        loader = Loader([ds], [Batch(4, drop_last=False)], canonical_replicas=2, chunk_size=16,
                        exhaustion="stop", runner=runner, num_workers=2)
        with loader:
            ids = sorted(i for mb in loader for i in mb["id"])
        assert ids == list(range(160))
        return loader.metrics()["remote"]

    def shard_gets():
        return sum(1 for method, path in proxy.requests if method == "GET" and "/shard." in path)

    try:
        first = one_pass()
        assert shard_gets() == len(shards)
        assert first["cache_misses"] == first["downloads"] == len(shards)
        assert first["downloaded_bytes"] == sizes
        assert first["range_reads"] == first["range_bytes"] == 0
        second = one_pass()
        assert shard_gets() == len(shards)  # nothing more was fetched
        assert second["cache_misses"] == second["downloads"] == second["downloaded_bytes"] == 0
        assert second["cache_hits"] >= len(shards)  # every shard read at least once, from the cache
    finally:
        proxy.close()
