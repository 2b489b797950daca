"""A finite pass split over lanes by size (zephon/work/balance.py): lanes end within a row of each other.

Corpora are made here (lognormal document lengths, ``tokenizer="bytes"``: a document's tokens are its bytes plus
EOS, counted here), so every expected number comes from the input rows, never from the code under test.
"""
from __future__ import annotations

import json
import math
import warnings
from collections import Counter

import numpy as np
import pytest

MAX_LEN = 2048


def write_docs(path, n: int, seed: int = 0, median: int = 80) -> list[int]:
    """``n`` JSONL documents ``{"text": "<index>:<letters>"}``, lognormal lengths; returns the texts' bytes."""
    rng = np.random.default_rng(seed)
    lengths = np.clip(np.round(rng.lognormal(math.log(median), 0.65, n)), 8, 4000).astype(int).tolist()
    texts = [f"{i}:" + "".join(chr(97 + (i * 7 + j) % 26) for j in range(k)) for i, k in enumerate(lengths)]
    with open(path, "w", encoding="utf-8") as fh:
        fh.writelines(json.dumps({"text": t}) + "\n" for t in texts)
    return [len(t) for t in texts]


def packed_pass(path, lanes: int, drop_last: bool) -> dict:
    """One finite packed pass (``Pack(2048)``, ``Batch(1)``): delivered rows, padding rows, real tokens, dropped."""
    from zephon import Batch, Decode, Loader, Pack, Tokenize, open_dataset

    ops = [Decode(), Tokenize("bytes", eos_id="<eos>", max_length=MAX_LEN), Pack(MAX_LEN),
           Batch(1, drop_last=drop_last)]
    rows = pad = tokens = 0
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with Loader([open_dataset(str(path))], ops, canonical_replicas=lanes, exhaustion="stop") as L:
            for mb in L:
                rows += len(mb["input_ids"])
                pad += mb.get("__pad__", 0)
                tokens += int(mb["attention_mask"].sum())
            dropped = L.stats()["dropped_rows"]
    return {"rows": rows, "pad": pad, "tokens": tokens, "dropped": dropped}


@pytest.fixture(scope="module")
def lognormal(tmp_path_factory):
    path = tmp_path_factory.mktemp("pass-end") / "docs.jsonl"
    lengths = write_docs(path, 12_000)
    return path, sum(lengths) + len(lengths)  # tokens: bytes + one EOS per document


@pytest.mark.parametrize("lanes", [8, 16, 64])
def test_lanes_end_a_packed_pass_within_a_row(lognormal, lanes):
    """Without drop_last, fewer than one step of all-padding rows (the count split paid several steps at 8,
    16 and 64 lanes) and every token delivered; the pass's rows within 0.6% of the fewest whole steps any
    split could deliver (ceil(tokens / 2048) rows rounded up to a step). With drop_last, fewer than one step
    of rows dropped."""
    path, tokens = lognormal
    r = packed_pass(path, lanes, drop_last=False)
    assert r["tokens"] == tokens
    assert r["pad"] < lanes, f"{r['pad']} all-padding rows at the pass's end over {lanes} lanes"
    fewest = lanes * -(-math.ceil(tokens / MAX_LEN) // lanes)
    assert r["rows"] <= fewest + max(lanes, math.ceil(0.006 * fewest)), (r, fewest)
    d = packed_pass(path, lanes, drop_last=True)
    assert d["dropped"] < lanes, f"{d['dropped']} rows dropped over {lanes} lanes"
    # drop_last plans whole rows per lane (ALGORITHM_VERSION 4): whole steps delivered, every token not
    # delivered in a dropped row (at most 2048 each), counted against the input
    assert d["rows"] % lanes == 0
    assert 0 <= tokens - d["tokens"] <= d["dropped"] * MAX_LEN, (d, tokens)


def row_docs(mb) -> tuple:
    """The documents of a packed row, by the ``id:`` each text starts with (bytes ids: byte b is b + 3, EOS 2)."""
    ids = [int(t) for t, m in zip(mb["input_ids"][0], mb["attention_mask"][0]) if m]
    docs = bytes(t - 3 if t > 2 else 10 for t in ids).decode().split("\n")[:-1]
    return tuple(d.split(":")[0] for d in docs)


def _run(datasets, dp: int, stop_after: int | None = None, state=None, **kw):
    """``(step, lane, micro, documents)`` of every packed row of every rank; and the merged checkpoint when
    each rank stopped after ``stop_after`` rows."""
    from zephon import Batch, Decode, Loader, Pack, Tokenize, merge_states

    ops = [Decode(), Tokenize("bytes", eos_id="<eos>", max_length=1024), Pack(1024), Batch(1, drop_last=False)]
    out, states = [], []
    for rank in range(dp):
        L = Loader(datasets, ops, canonical_replicas=8, chunk_size=8, exhaustion="stop", dp_degree=dp,
                   dp_rank=rank, **kw)
        if state is not None:
            L.restore(state)
        for k, mb in enumerate(iter(L)):
            if row_docs(mb):  # all-padding rows: a rank alone pads only until its own lanes end (hosts agree)
                out.append((mb["__step__"], mb["__lane__"], mb["__micro__"], row_docs(mb)))
            if stop_after is not None and k + 1 == stop_after:
                break
        states.append(L.checkpoint())
        L.close()
    return out, (merge_states(states) if stop_after is not None else None)


@pytest.fixture(scope="module")
def skewed(tmp_path_factory):
    """Two JSONL shards of very unequal document lengths: a count split would give lanes unequal bytes."""
    root = tmp_path_factory.mktemp("skewed")
    write_docs(root / "a.jsonl", 300, seed=1, median=30)
    with open(root / "b.jsonl", "w", encoding="utf-8") as fh:
        for i in range(300, 420):
            fh.write(json.dumps({"text": f"{i}:" + "x" * (400 + 37 * (i % 11))}) + "\n")
    return root


def test_size_split_delivers_every_sample_once_at_any_dp_and_resumes_exactly(skewed):
    """The size split gives lanes unequal counts (the count split gave each 52 or 53); each document once per
    pass at dp 1, 2, 4 and 8; a pass saved at dp 2 mid-way and resumed at dp 4 and 8 equals the uninterrupted
    run micro-batch for micro-batch."""
    from zephon import open_dataset
    from zephon.work import WorkSource

    ds = [open_dataset(str(skewed))]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        src = WorkSource(ds, canonical_replicas=8, chunk_size=8, exhaustion="stop", split="size")
    counts = [src.lane_positions(lane) for lane in range(8)]
    assert sum(counts) == 420 and max(counts) - min(counts) > 1, counts
    whole, _ = _run(ds, 1)
    ids = Counter(d for *_, docs in whole for d in docs)
    assert ids == Counter(map(str, range(420)))
    for dp in (2, 4, 8):
        got, _ = _run(ds, dp, runner="threads", num_workers=2)
        assert sorted(got) == sorted(whole), f"dp={dp}"
    head, state = _run(ds, 2, stop_after=15)
    state = json.loads(json.dumps(state))
    for dp in (4, 8):
        tail, _ = _run(ds, dp, state=state)
        assert sorted(head + tail) == sorted(whole), f"saved at dp=2, resumed at dp={dp}"
        assert not set(head) & set(tail)


def test_mds_keeps_the_count_split(lognormal, tmp_path):
    """An MDS dataset (written by streaming's MDSWriter) reports no sample sizes, local and raw included: only a
    local raw shard's header knows them, and the split must not depend on where the data lives (a bucket and its
    local copy give the same batches, tests/test_remote_split.py). Its 8 lanes hold 750 of the 6000 samples."""
    MDSWriter = pytest.importorskip("streaming").MDSWriter
    from zephon import open_dataset
    from zephon.work import WorkSource

    path, _ = lognormal
    texts = [json.loads(line)["text"] for line in open(path, encoding="utf-8")][:6000]
    out = tmp_path / "mds"
    with MDSWriter(out=str(out), columns={"text": "str"}, size_limit=1 << 18) as w:
        for t in texts:
            w.write({"text": t})
    ds = open_dataset(str(out))
    assert len(ds.shard_sizes) > 1
    assert all(ds.sample_sizes(s) is None for s in range(len(ds.shard_sizes)))
    src = WorkSource([ds], canonical_replicas=8, chunk_size=64, exhaustion="stop", split="size")
    assert [src.lane_positions(lane) for lane in range(8)] == [750] * 8


def test_count_split_where_sizes_are_unknown_or_the_pass_is_long(skewed, monkeypatch):
    """No Pack (``split="count"``), or a pass past ``BALANCE_LIMIT``: lanes hold 52 or 53 of the 420 samples."""
    from zephon import open_dataset
    from zephon.work import WorkSource, balance

    ds = [open_dataset(str(skewed))]
    kw = dict(canonical_replicas=8, chunk_size=8, exhaustion="stop")
    assert sorted({WorkSource(ds, **kw).lane_positions(lane) for lane in range(8)}) == [52, 53]
    monkeypatch.setattr(balance, "BALANCE_LIMIT", 419)
    assert sorted({WorkSource(ds, split="size", **kw).lane_positions(lane) for lane in range(8)}) == [52, 53]


@pytest.mark.parametrize("exhaustion,chunk_size", [("stop", 8), ("stop", 16), ("fill", 8), ("stop", 64)])
def test_size_split_covers_every_position_once(skewed, exhaustion, chunk_size):
    """Every position of the pass (and of a ``fill`` pass's repeats) is in exactly one chunk of one lane, chunks
    hold at most ``chunk_size`` positions, and every lane has some: at chunk sizes giving many rounds or one."""
    from zephon import open_dataset
    from zephon.work import WorkSource

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        src = WorkSource([open_dataset(str(skewed))], canonical_replicas=8, chunk_size=chunk_size,
                         exhaustion=exhaustion, fill_multiple=64, split="size")
    want = 420 if exhaustion == "stop" else 448  # 420 rounded up to a multiple of 64
    chunks = [src.chunk(lane, c) for lane in range(8) for c in range(src.num_chunks(lane))]
    assert all(0 < len(c) <= chunk_size for c in chunks)
    assert sorted(p for c in chunks for p in c.positions.tolist()) == list(range(want))
    assert all(src.lane_positions(lane) > 0 for lane in range(8))
    assert len(src.chunk(0, src.num_chunks(0))) == 0
