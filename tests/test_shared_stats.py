"""stats() with more ranks than lanes counts what THIS rank delivered (its block of each step), not the whole
lane: summed over the ranks it equals the rows counted here from the input file and from what each rank yielded."""
from __future__ import annotations

import json

import pytest

from zephon import Batch, Decode, Loader, open_dataset

DOCS = 37  # rows (one per document, no packing): an odd count, so the last step is partial


@pytest.fixture
def data(tmp_path):
    p = tmp_path / "a.jsonl"
    with open(p, "w") as fh:
        for i in range(DOCS):
            fh.write(json.dumps({"text": f"document {i}"}) + "\n")
    return str(p)


def _rank(data, dp, rank, drop_last):
    # 2 lanes, 4 rows per lane step; dp 4: 2 ranks share each lane, each taking 1 micro-batch of 2 rows per step
    return Loader([open_dataset(data)], [Decode("text"), Batch(2, drop_last=drop_last)], canonical_replicas=2,
                  global_batch_size=8, chunk_size=4, exhaustion="stop", dp_degree=dp, dp_rank=rank,
                  runner="inline")


@pytest.mark.parametrize("drop_last", [False, True])
def test_stats_of_sharing_ranks_sum_to_what_they_delivered(data, drop_last):
    totals = {"delivered_rows": 0, "padded_rows": 0, "dropped_rows": 0}
    texts = []
    for rank in range(4):
        L = _rank(data, 4, rank, drop_last)
        real = pad = 0
        for mb in L:
            n_pad = mb.get("__pad__", 0)
            real += len(mb["text"]) - n_pad
            pad += n_pad
            texts += mb["text"][:len(mb["text"]) - n_pad]
        st = L.stats()
        assert (st["delivered_rows"], st["padded_rows"]) == (real, pad), f"rank {rank}: {st}"
        for k in totals:
            totals[k] += st[k]
    delivered = len(texts)
    assert len(set(texts)) == delivered  # no row delivered twice
    if drop_last:
        assert totals["padded_rows"] == 0 and delivered < DOCS
        assert totals["delivered_rows"] + totals["dropped_rows"] == DOCS  # nothing unaccounted for
    else:
        assert totals["delivered_rows"] == delivered == DOCS and totals["dropped_rows"] == 0
        assert totals["padded_rows"] > 0
    # the same pass on one rank: same rows delivered, same padding or drops
    ref = _rank(data, 1, 0, drop_last)
    n = sum(len(mb["text"]) - mb.get("__pad__", 0) for mb in ref)
    assert n == delivered
    assert (ref.stats()["padded_rows"], ref.stats()["dropped_rows"]) == (totals["padded_rows"], totals["dropped_rows"])


def test_stats_mid_pass(data):
    """Part way through, each rank's delivered_rows is what it yielded so far."""
    for rank in range(4):
        L = _rank(data, 4, rank, False)
        it = iter(L)
        got = sum(len(next(it)["text"]) for _ in range(3))
        assert L.stats()["delivered_rows"] == got == 6
