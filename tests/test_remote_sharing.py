"""Node-local sharing of one cache (issue 24, item 6): the ranks of a node download each object once.

Real processes (spawn) read one MDS dataset from moto's S3 server through a counting proxy (``FaultProxy``
records every request line it forwards): the oracle is the number of GETs of each object seen on the wire, and
the ids each process delivers (written by the test).
"""
from __future__ import annotations

import multiprocessing as mp
import os
from collections import Counter

import pytest

from zephon.formats import open_dataset

from s3_server import FaultProxy
from test_remote_trust import A_IDS, ids, write_ids


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    return write_ids(tmp_path_factory.mktemp("sharing") / "ds", 0)


def _read(url, local, go, out):
    go.wait(60)
    out.put((local, ids(open_dataset(url, local=local))))


def _run(s3, dataset, monkeypatch, folders: list[str]) -> tuple[list, Counter]:
    """Start one process per entry of ``folders`` (its cache folder) together; returns ``([(folder, ids)],
    GETs per object key seen by the proxy)``."""
    url = s3.upload_dir(dataset, "shared")
    proxy = FaultProxy(s3.endpoint)
    monkeypatch.setenv("S3_ENDPOINT_URL", proxy.endpoint)  # inherited by the spawned processes
    ctx = mp.get_context("spawn")
    go, out = ctx.Event(), ctx.Queue()
    procs = [ctx.Process(target=_read, args=(url, f, go, out)) for f in folders]
    try:
        for p in procs:
            p.start()
        go.set()
        results = [out.get(timeout=240) for _ in procs]
    finally:
        for p in procs:
            p.join(30)
            if p.is_alive():
                p.kill()
        proxy.close()
    gets = Counter(path.split("?")[0].rsplit("/", 1)[-1] for m, path in proxy.requests if m == "GET")
    return results, gets


def _shards(dataset) -> list[str]:
    return sorted(f for f in os.listdir(dataset) if f.startswith("shard."))


def test_eight_processes_on_one_cache_download_each_object_once(s3, dataset, tmp_path, monkeypatch):
    local = str(tmp_path / "node")
    results, gets = _run(s3, dataset, monkeypatch, [local] * 8)
    assert [i for _, i in results] == [A_IDS] * 8
    assert {k: gets[k] for k in _shards(dataset)} == {k: 1 for k in _shards(dataset)}
    assert gets["index.json"] == 8  # each open reads the index afresh


def test_two_nodes_with_their_own_folders_download_each_object_once_per_node(s3, dataset, tmp_path, monkeypatch):
    nodes = [str(tmp_path / "node0"), str(tmp_path / "node1")]
    results, gets = _run(s3, dataset, monkeypatch, nodes * 2)  # two ranks per node
    assert sorted(f for f, _ in results) == sorted(nodes * 2) and [i for _, i in results] == [A_IDS] * 4
    assert {k: gets[k] for k in _shards(dataset)} == {k: 2 for k in _shards(dataset)}
    for n in nodes:
        assert sorted(f for f in os.listdir(n) if f.startswith("shard.")) == _shards(dataset)
