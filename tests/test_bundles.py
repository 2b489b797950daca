"""host.workers.bundled: a host worker's items travel in lists of whole (step, micro-batch) positions, one list per
host item, without losing, repeating or reordering an item; and the adapters' streams are unchanged by it.

Oracles: items and their positions made in the test; the worker's items one by one (``RankSession.worker_items``).
"""
from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from zephon import Batch, Decode, open_dataset
from zephon.host import RankSession
from zephon.host.workers import bundled


@st.composite
def worker_streams(draw):
    """A worker's lanes, their first positions (ragged after a mid-step restore), and its items in its order:
    position, then lane; 1-3 items per lane micro-batch (a host's ``finish`` may split one), ``last`` on the final."""
    lanes = sorted(draw(st.lists(st.integers(0, 63), min_size=1, max_size=5, unique=True)))
    micros = draw(st.integers(1, 3))  # micro-batches per lane step
    positions = [(s, m) for s in range(4) for m in range(micros)]
    starts = {lane: draw(st.sampled_from(positions[:micros + 1])) for lane in lanes}
    ended = draw(st.sampled_from([None] + lanes))  # a lane whose stream ends early (a finite pass)
    items = []
    for pos in positions:
        for lane in lanes:
            if starts[lane] > pos or (lane == ended and pos >= positions[-micros]):
                continue
            n = draw(st.integers(1, 3))
            items += [({"step": pos[0], "micro": pos[1], "lane": lane, "last": k == n - 1}, (pos, lane, k))
                      for k in range(n)]
    if draw(st.booleans()):
        items.append(({"dropped_rows": 3}, None))  # a finite stream's end marker has no position
    return lanes, starts, items, draw(st.integers(1, 4))


@settings(max_examples=300, deadline=None)
@given(worker_streams())
def test_bundles_are_whole_consecutive_positions(case):
    lanes, starts, items, per = case
    out = list(bundled(iter(items), lanes, starts, per))
    assert [it for b in out for it in b] == items  # nothing lost, repeated or moved
    # expected: the first position's items one by one, then the later positions (in order of first appearance)
    # cut into runs of `per`
    order = list(dict.fromkeys((m["step"], m["micro"]) for m, _ in items if "step" in m))
    first = [[order[0]]] * sum(1 for m, _ in items if (m.get("step"), m.get("micro")) == order[0]) if order else []
    runs = first + [order[i:i + per] for i in range(1, len(order), per)]
    got = [list(dict.fromkeys((m["step"], m["micro"]) for m, _ in b if "step" in m)) for b in out]
    got = [g for g in got if g]  # a trailing list may hold only the end marker
    assert got == runs


def test_a_bundle_goes_out_with_its_last_item():
    """The first position's items go one by one (a host batch may be one lane's: the first waits for one lane);
    a list is handed over as soon as its last position's last lane delivered, not when the next item arrives (the
    worker computes nothing more for it)."""
    lanes, starts = [1, 3], {1: (0, 0), 3: (0, 0)}
    pulled = []

    def items():
        for step in range(3):
            for lane in lanes:
                pulled.append((step, lane))
                yield {"step": step, "micro": 0, "lane": lane, "last": True}, None

    b = bundled(items(), lanes, starts, 2)
    assert [[(m["step"], m["lane"]) for m, _ in next(b)] for _ in range(2)] == [[(0, 1)], [(0, 3)]]  # one by one
    assert pulled == [(0, 1), (0, 3)]
    second = next(b)
    assert [(m["step"], m["lane"]) for m, _ in second] == [(1, 1), (1, 3), (2, 1), (2, 3)]
    assert pulled == [(0, 1), (0, 3), (1, 1), (1, 3), (2, 1), (2, 3)]
    b.close()


@pytest.fixture(scope="module")
def text_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("text")
    with open(d / "docs.jsonl", "w") as fh:
        for i in range(301):
            fh.write(json.dumps({"text": f"document {i}"}) + "\n")
    return str(d)


def _session(text_dir):
    return RankSession.from_config([open_dataset(text_dir)], [Decode("text"), Batch(2)], canonical_replicas=8,
                                   global_batch_size=32, chunk_size=4, seed=3, exhaustion="stop")


@pytest.mark.parametrize("positions", [1, 2, 3])
def test_worker_bundles_hold_the_workers_items_in_order(text_dir, positions):
    """A real session's worker share (2 workers, 4 lanes each, 2 micro-batches per lane step), restored mid-step:
    the bundles flatten to the items the worker yields one by one; after the first position's items (one by one) each
    list holds ``positions`` positions of all four lanes."""
    ref_session = _session(text_dir)
    ref_session.begin()
    seen = []
    for item in ref_session.worker_items(0, 0, runner="inline"):
        seen.append(item)
        if len(seen) == 8 * 3 + 5:  # 3 micro-batches of every lane, then 5 lanes of the 4th: mid-step
            break
    ref_session.consumed(seen)
    state = ref_session.rank_state()

    session, check = _session(text_dir), _session(text_dir)
    session.load(state)
    check.load(state)
    one_by_one = [(m, list(p["text"]) if p is not None else None) for m, p in check.worker_items(2, 1, runner="inline")]
    bundles = [[(m, list(p["text"]) if p is not None else None) for m, p in b]
               for b in session.worker_bundles(2, 1, positions, runner="inline")]
    assert [it for b in bundles for it in b] == one_by_one
    # worker 1's lanes 1, 3, 5, 7: lanes 5 and 7 still owe (step 1, micro 1), one item each, alone; then lists of
    # `positions` whole positions of all four lanes (the last may hold fewer)
    assert [[(m["step"], m["micro"], m["lane"]) for m, _ in b] for b in bundles[:2]] == [[(1, 1, 5)], [(1, 1, 7)]]
    for b in bundles[2:-1]:
        pos = list(dict.fromkeys((m["step"], m["micro"]) for m, _ in b if "step" in m))
        assert len(pos) == positions
        assert [m["lane"] for m, _ in b if "step" in m] == [1, 3, 5, 7] * positions
