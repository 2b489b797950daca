"""zephon.host.step_bundles: a host worker's items grouped per step (one transfer per step and worker).

Oracles: the ungrouped items themselves (flattened, the bundles are the same items in the same order) and metas
written in the test; the latency property is checked by counting how far the grouping pulled its input.
"""
from __future__ import annotations

import json

import pytest

from zephon import Batch, Decode, open_dataset
from zephon.host import RankSession
from zephon.host.bundles import step_bundles


def _meta(step, lane, micro, last=True):
    return {"step": step, "lane": lane, "micro": micro, "last": last}


def test_a_step_is_yielded_once_every_lane_gave_its_last_micro_batch():
    items = [(_meta(0, 1, 0), "a"), (_meta(0, 3, 0), "b"), (_meta(0, 1, 1), "c"), (_meta(0, 3, 1), "d"),
             (_meta(1, 1, 0), "e"), (_meta(1, 3, 0), "f"), (_meta(1, 1, 1), "g"), (_meta(1, 3, 1), "h")]
    pulled = []

    def source():
        for it in items:
            pulled.append(it[1])
            yield it

    bundles = step_bundles(source(), [1, 3], last_micro=1)
    first = next(bundles)
    assert [p for _, p in first] == ["a", "b", "c", "d"]
    assert pulled == ["a", "b", "c", "d"]  # step 0 went out without waiting for step 1's first item
    assert [[p for _, p in b] for b in bundles] == [["e", "f", "g", "h"]]


def test_a_lane_missing_from_a_step_and_the_drop_report_close_bundles():
    # lane 3 ended before step 1 (a finite pass): step 1 closes when step 2's item or the end comes
    items = [(_meta(0, 1, 0), "a"), (_meta(0, 3, 0), "b"), (_meta(1, 1, 0), "c"), (_meta(2, 1, 0), "d"),
             ({"dropped_rows": 5}, None)]
    got = [[p for _, p in b] for b in step_bundles(iter(items), [1, 3], last_micro=0)]
    assert got == [["a", "b"], ["c"], ["d"], [None]]


def test_closing_the_bundles_closes_the_items():
    closed = []

    def source():
        try:
            for k in range(10):
                yield _meta(k, 0, 0), k
        finally:
            closed.append(True)

    bundles = step_bundles(source(), [0], last_micro=0)
    next(bundles)
    bundles.close()
    assert closed == [True]


@pytest.mark.parametrize("W", [0, 1, 2, 3])
def test_worker_bundles_are_the_worker_items_grouped(tmp_path, W):
    with open(tmp_path / "docs.jsonl", "w") as fh:
        for i in range(150):
            fh.write(json.dumps({"text": f"document {i}"}) + "\n")

    def session():
        return RankSession.from_config([open_dataset(str(tmp_path))], [Decode("text"), Batch(2, drop_last=False)],
                                       canonical_replicas=6, chunk_size=8, exhaustion="stop", seed=1)

    for w in range(max(W, 1)):
        want = list(session().worker_items(W, w))
        bundles = list(session().worker_bundles(W, w))
        assert [it for b in bundles for it in b] == want
        steps = [{m.get("step") for m, _ in b} for b in bundles]
        assert all(len(s) == 1 for s in steps), steps  # one step per bundle
        if want:
            assert len(bundles) == len({m.get("step") for m, _ in want})
