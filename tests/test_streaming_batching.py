"""zephon_streaming's ``batching_method`` and ``sampling_method`` against mosaicml-streaming's own.

Oracle: mosaicml-streaming 0.13's ``StreamingDataset`` over the same shards written by ``streaming.MDSWriter``
(in this process at world size 1; as real gloo ranks in subprocesses for ``device_per_stream``, marked slow),
and the stream sizes this test writes. Elasticity: a checkpoint taken at world size 4 resumes at 2 and 1
with every global batch equal (SHA-256 of its rows) to an uninterrupted single-rank run.
"""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import warnings
from collections import Counter

import pytest

pytest.importorskip("torch")
pytest.importorskip("streaming")

from torch.utils.data import DataLoader  # noqa: E402

from helpers import world  # noqa: E402
from test_streaming_adapter import digest, gather_states  # noqa: E402
from zephon_streaming import RefusedKeyword, Stream, StreamingDataset  # noqa: E402

SIZES = {"a": 240, "b": 120, "c": 80}  # samples per stream; stream s holds ids s_index * 10_000 + i
GBS = 8


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    from streaming import MDSWriter

    root = tmp_path_factory.mktemp("batching")
    dirs = []
    for k, (name, n) in enumerate(SIZES.items()):
        with MDSWriter(out=str(root / name), columns={"id": "int", "text": "str"}, size_limit=2048) as w:
            for i in range(n):
                w.write({"id": k * 10_000 + i, "text": f"{name} {i}"})
        dirs.append(str(root / name))
    return {"dirs": dirs, "agg": str(root / "agg")}


def ours(shards, rank=0, size=1, **kw):
    kw.setdefault("batch_size", GBS // size)
    kw.setdefault("num_canonical_nodes", 4)
    kw.setdefault("shuffle", True)
    kw.setdefault("shuffle_seed", 17)
    kw.setdefault("chunk_size", 4)
    with world(rank, size):
        return StreamingDataset(streams=[Stream(local=d) for d in shards["dirs"]], aggregate_dir=shards["agg"], **kw)


def mosaic_batches(shards, **kw):
    """One epoch of mosaicml-streaming's own StreamingDataset at world size 1: batches of sample ids."""
    from streaming import Stream as MosaicStream
    from streaming import StreamingDataset as MosaicDataset

    kw.setdefault("batch_size", GBS)
    kw.setdefault("num_canonical_nodes", 4)
    kw.setdefault("shuffle", True)
    with world(0, 1):
        ds = MosaicDataset(streams=[MosaicStream(local=d) for d in shards["dirs"]], **kw)
        return [b["id"].tolist() for b in DataLoader(ds, batch_size=kw["batch_size"])]


def global_batches(dsets):
    """One epoch of every simulated rank, one rank batch each per step: global batches of sample ids."""
    its = [iter(DataLoader(d, batch_size=d.batch_size)) for d in dsets]
    out = []
    while True:
        try:
            out.append([i for it in its for i in next(it)["id"].tolist()])
        except StopIteration:
            return out


def streams_of(batch):
    return [i // 10_000 for i in batch]


@pytest.mark.contract("streaming.batching")
def test_stratified_batches_match_mosaics_composition(shards):
    """Every global batch holds each stream's share rounded as Mosaic rounds ([4, 2, 2] of 8 here), in
    Mosaic's layout (stream after stream), as many batches as Mosaic yields; the same at world sizes 1 and 4."""
    theirs = [streams_of(b) for b in mosaic_batches(shards, batching_method="stratified")]
    one = global_batches([ours(shards, batching_method="stratified")])
    four = global_batches([ours(shards, r, 4, batching_method="stratified", run_id="s4") for r in range(4)])
    assert one == four
    assert [streams_of(b) for b in one] == theirs
    # independent of both: 240:120:80 of 8 -> 4.36, 2.18, 1.45 -> floors 4, 2, 1 and the slot left to stream c
    assert theirs == [[0, 0, 0, 0, 1, 1, 2, 2]] * (80 // 2)
    ds = ours(shards, batching_method="stratified")
    assert len(ds) == 40 * GBS and ds.dropped_per_epoch == sum(SIZES.values()) - 40 * GBS
    assert len({i for b in one for i in b}) == 40 * GBS, "no sample twice in an epoch"


@pytest.mark.contract("streaming.batching")
def test_per_stream_batches_match_mosaics_composition(shards):
    """Every global batch from one stream; batches per stream as Mosaic's (each stream's full batches); the
    same global batches at world sizes 1 and 2; another order next epoch (shuffle)."""
    theirs = [set(streams_of(b)) for b in mosaic_batches(shards, batching_method="per_stream")]
    ds = ours(shards, batching_method="per_stream")
    one = global_batches([ds])
    two = global_batches([ours(shards, r, 2, batching_method="per_stream", run_id="p2") for r in range(2)])
    assert one == two
    mine = [set(streams_of(b)) for b in one]
    assert all(len(s) == 1 for s in mine + theirs)
    want = Counter({k: n // GBS for k, n in enumerate(SIZES.values())})
    assert Counter(s.pop() for s in mine) == Counter(s.pop() for s in theirs) == want
    assert len(ds) == sum(want.values()) * GBS
    nxt = global_batches([ds])
    assert [streams_of(b) for b in nxt] != [streams_of(b) for b in one]
    assert sorted(i for b in nxt for i in b) == sorted(i for b in one for i in b)


@pytest.mark.contract("streaming.batching")
def test_device_per_stream_one_stream_per_lane_step(shards):
    """Each lane step (a canonical device micro-batch: global batch / num_canonical_nodes rows) is from one
    stream, so at one device per lane each device's micro-batch is; lane steps per stream as Mosaic's device
    batches at that world (n // micro-batch); at one lane, as Mosaic's world-1 epoch."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # one lane per device: no warning
        dsets = [ours(shards, r, 4, batching_method="device_per_stream", run_id="d4") for r in range(4)]
    four = global_batches(dsets)
    one = global_batches([ours(shards, batching_method="device_per_stream")])
    assert one == four
    micro = [streams_of(b[j:j + 2]) for b in four for j in range(0, GBS, 2)]
    assert all(len(set(m)) == 1 for m in micro)
    blocks = sum(n // 2 for n in SIZES.values())
    assert len(four) == blocks // 4
    got = Counter(m[0] for m in micro)
    assert all(0 <= n // 2 - got[k] < 4 for k, n in enumerate(SIZES.values())), got  # whole steps: < 4 dropped
    with pytest.warns(UserWarning, match="4 lane steps of 2 rows"):
        ours(shards, batching_method="device_per_stream")
    mono = [set(streams_of(b)) for b in global_batches([ours(shards, batching_method="device_per_stream",
                                                             num_canonical_nodes=1)])]
    theirs = [set(streams_of(b)) for b in mosaic_batches(shards, batching_method="device_per_stream",
                                                         num_canonical_nodes=1)]
    assert all(len(s) == 1 for s in mono + theirs)
    assert Counter(s.pop() for s in mono) == Counter(s.pop() for s in theirs)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def mosaic_gloo_batches(shards, tmp_path, kwargs, size=2):
    """One epoch of mosaicml-streaming's own StreamingDataset on ``size`` real gloo ranks (subprocesses of
    tests/mosaic_batching_job.py): per rank, its device batches of sample ids."""
    config = tmp_path / "config.json"
    config.write_text(json.dumps({"streams": shards["dirs"], "kwargs": kwargs}))
    env = {**os.environ, "WORLD_SIZE": str(size), "LOCAL_WORLD_SIZE": str(size), "MASTER_ADDR": "127.0.0.1",
           "MASTER_PORT": str(_free_port())}
    job = os.path.join(os.path.dirname(__file__), "mosaic_batching_job.py")
    procs = [subprocess.Popen([sys.executable, job, str(config), str(tmp_path / f"rank{r}.json")],
                              env={**env, "RANK": str(r)}) for r in range(size)]
    for p in procs:
        assert p.wait(timeout=300) == 0, "a mosaicml-streaming rank failed (its stderr is above)"
    return [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(size)]


@pytest.mark.slow
@pytest.mark.contract("streaming.batching")
@pytest.mark.parametrize("method", ["stratified", "per_stream", "device_per_stream"])
def test_compositions_match_mosaic_on_two_gloo_ranks(shards, tmp_path, method):
    """Oracle: Mosaic on 2 real gloo ranks (batch_size 4, num_canonical_nodes 2, one lane per device).
    stratified: every device batch has Mosaic's streams in Mosaic's order; per_stream: every global batch one
    stream, as many per stream as Mosaic's; device_per_stream: every device batch one stream, as many per
    stream as Mosaic's (n // 4 each)."""
    kwargs = {"batch_size": 4, "num_canonical_nodes": 2, "shuffle": True, "batching_method": method}
    theirs = mosaic_gloo_batches(shards, tmp_path, kwargs)
    assert len(theirs[0]) == len(theirs[1])
    dsets = [ours(shards, r, 2, num_canonical_nodes=2, batching_method=method, run_id=f"g2{method}")
             for r in range(2)]
    mine = [(streams_of(b[:4]), streams_of(b[4:])) for b in global_batches(dsets)]
    theirs = list(zip(*([streams_of(b) for b in rank] for rank in theirs)))
    assert len(mine) == len(theirs)
    if method == "stratified":
        assert [list(m) for m in mine] == [list(t) for t in theirs] == [[[0, 0, 0, 0], [1, 1, 2, 2]]] * len(mine)
        return
    if method == "per_stream":
        mine, theirs = [[m[0] + m[1]] for m in mine], [[t[0] + t[1]] for t in theirs]
    flat_mine, flat_theirs = [b for m in mine for b in m], [b for t in theirs for b in t]
    assert all(len(set(b)) == 1 for b in flat_mine + flat_theirs)
    block = 8 if method == "per_stream" else 4
    assert Counter(b[0] for b in flat_mine) == Counter(b[0] for b in flat_theirs) == \
        Counter({k: n // block for k, n in enumerate(SIZES.values())})


@pytest.mark.contract("streaming.batching", "streaming.elastic")
@pytest.mark.parametrize("method", ["stratified", "per_stream", "device_per_stream"])
def test_batching_resumes_exactly_at_another_world_size(shards, method):
    """Checkpoint at world size 4 after 5 global steps; resume at 2 and at 1: the rest of the epoch and the
    next epoch equal an uninterrupted single-rank run, batch by batch."""
    ref = ours(shards, batching_method=method)
    want = [[digest(b) for b in global_batches([ref])] for _ in range(2)]
    dsets = [ours(shards, r, 4, batching_method=method, run_id=f"r4{method}") for r in range(4)]
    its = [iter(DataLoader(d, batch_size=d.batch_size)) for d in dsets]
    head = [digest([i for it in its for i in next(it)["id"].tolist()]) for _ in range(5)]
    assert head == want[0][:5]
    state = json.loads(json.dumps(gather_states(dsets, 5 * GBS)))
    del its
    for size in (2, 1):
        again = [ours(shards, r, size, batching_method=method, run_id=f"r{size}{method}") for r in range(size)]
        for d in again:
            d.load_state_dict(state)
        rest = [digest(b) for b in global_batches(again)]
        assert rest == want[0][5:], (method, size)
        assert [digest(b) for b in global_batches(again)] == want[1], "the next __iter__ is epoch 1"


@pytest.mark.contract("streaming.batching")
def test_batching_state_does_not_load_into_another_method(shards):
    ds = ours(shards, batching_method="stratified")
    it = iter(DataLoader(ds, batch_size=GBS))
    next(it)
    state = ds.state_dict(GBS, True)
    other = ours(shards, batching_method="per_stream")
    with pytest.raises(Exception, match="batching"):
        other.load_state_dict(state)
        next(iter(DataLoader(other, batch_size=GBS)))


@pytest.mark.contract("streaming.keywords")
def test_sampling_method_fixed_is_balanced_without_shuffle_and_refused_with_it(shards):
    """``fixed`` keeps every epoch's samples; without shuffle Zephon's epochs are already identical (one seed),
    so it is accepted and changes nothing; with shuffle it is refused, saying why."""
    fixed = ours(shards, sampling_method="fixed", shuffle=False, epoch_size=200)
    bal = ours(shards, sampling_method="balanced", shuffle=False, epoch_size=200)
    e0, e1 = global_batches([fixed]), global_batches([fixed])
    assert e0 == e1 == global_batches([bal])
    assert len({i for b in e0 for i in b}) < sum(SIZES.values()), "a partial epoch: the same samples each time"
    with pytest.raises(RefusedKeyword, match="shuffle=False"):
        ours(shards, sampling_method="fixed", shuffle=True)
    with pytest.raises(ValueError, match="Invalid sampling method"):
        ours(shards, sampling_method="other")


@pytest.mark.contract("streaming.keywords")
def test_batching_refusals_say_why(shards, tmp_path):
    with pytest.raises(ValueError, match="Invalid batching method"):
        ours(shards, batching_method="round_robin")
    with pytest.raises(RefusedKeyword, match="packed"):
        ours(shards, batching_method="per_stream", tokenizer=str(tmp_path / "tok.json"), epoch_size=64)
    with pytest.raises(ValueError, match="dataset 2 has 80 samples per epoch, fewer than one global batch"):
        ours(shards, batching_method="per_stream", batch_size=100, num_canonical_nodes=4)
