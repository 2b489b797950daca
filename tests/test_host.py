"""zephon.host: the plumbing every host loader shares (worker shares, reassembly with the consumed state,
partial and initial checkpoints), and a text-only pipeline through zephon_torch.

Oracles: the input rows written by the test (every document once per pass), and an uninterrupted
single-process core Loader for the order.
"""
from __future__ import annotations

import json

import pytest

from zephon import Batch, CheckpointError, Decode, open_dataset
from zephon.host import RankSession, StepAgreement, worker_lanes

N_DOCS = 203


@pytest.fixture(scope="module")
def text_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("text")
    with open(d / "docs.jsonl", "w") as fh:
        for i in range(N_DOCS):
            fh.write(json.dumps({"text": f"document number {i}"}) + "\n")
    return str(d)


def _session(text_dir, dp=1, rank=0, drop_last=False, exhaustion="stop"):
    ds = [open_dataset(text_dir)]

    return RankSession.from_config(ds, [Decode("text"), Batch(2, drop_last=drop_last)], canonical_replicas=4,
                                   chunk_size=8, exhaustion=exhaustion, dp_degree=dp, dp_rank=rank, seed=3)


def _round_robin(iterators):
    """torch's DataLoader order: one item from each live worker in turn."""
    live = list(iterators)
    while live:
        for it in list(live):
            try:
                yield next(it)
            except StopIteration:
                live.remove(it)


def _texts(groups):
    """The documents of ``groups``, without the padding rows a finite pass's last step ends with
    (``meta["pad"]``: the micro-batch's last rows)."""
    return [t for g in groups for m, p in g for t in p["text"][:len(p["text"]) - m.get("pad", 0)]]


def test_workers_reassemble_to_the_single_process_order(text_dir):
    ref = _session(text_dir)
    want = _texts(ref.ordered_groups(ref.worker_items(0, 0)))
    assert sorted(want) == sorted(f"document number {i}" for i in range(N_DOCS))  # every document once
    for W in (1, 2, 3, 4):
        s = _session(text_dir)
        got = _texts(s.ordered_groups(_round_robin(s.worker_items(W, w) for w in range(W))))
        assert got == want, W


def test_state_is_what_was_consumed_and_resumes_at_other_worker_counts(text_dir):
    ref = _session(text_dir)
    want = _texts(ref.ordered_groups(ref.worker_items(0, 0)))
    s = _session(text_dir)
    groups = s.ordered_groups(_round_robin(s.worker_items(2, w) for w in range(2)))
    head = _texts(next(groups) for _ in range(7))  # the workers prefetched further: not counted
    state = json.loads(json.dumps(s.rank_state()))
    assert sum(e["delivered_rows"] for e in state["lanes"]) == len(head)
    for W in (0, 3):
        t = _session(text_dir)
        t.load(state)
        t.begin()
        tail = _texts(t.ordered_groups(_round_robin(t.worker_items(W, w) for w in range(max(W, 1)))))
        assert head + tail == want, W


def test_lane_entries_are_the_rank_states_lanes(text_dir):
    """``lane_entries()`` (what zephon_streaming publishes every step, without building a checkpoint) equals
    ``rank_state()["lanes"]`` before any item, after some, and after a load of entries written in another key order."""
    s = _session(text_dir)
    assert s.lane_entries() == s.rank_state()["lanes"]
    groups = s.ordered_groups(_round_robin(s.worker_items(2, w) for w in range(2)))
    for _ in range(5):
        next(groups)
        assert s.lane_entries() == s.rank_state()["lanes"]
    assert sum(e["delivered_rows"] for e in s.lane_entries()) == 5 * 4 * 2  # 5 groups: 4 lanes x 2 rows
    state = s.rank_state()
    state["lanes"] = [dict(reversed(list(e.items()))) for e in state["lanes"]]  # keys in another order
    t = _session(text_dir)
    t.load(state)
    t.begin()
    assert t.lane_entries() == s.rank_state()["lanes"]
    assert [list(e) for e in t.lane_entries()] == [list(e) for e in s.rank_state()["lanes"]]


def test_partial_rank_states_merge_and_missing_lanes_are_named(text_dir):
    states = []
    for r in range(2):
        s = _session(text_dir, dp=2, rank=r)
        next(iter(s.ordered_groups(s.worker_items(0, 0))))
        states.append(s.rank_state())
    whole = _session(text_dir)
    whole.load(states)  # a list of rank states is merged here
    assert {e["lane"] for e in whole.rank_state()["lanes"]} == {0, 1, 2, 3}
    half = _session(text_dir, dp=2, rank=1)
    half.load([states[1]])  # the rank's own state suffices
    with pytest.raises(CheckpointError, match=r"lacks lanes \[2, 3\]"):
        _session(text_dir, dp=2, rank=1).load([states[0]])


def test_initial_state_restarts(text_dir):
    s = _session(text_dir)
    first = _texts([next(iter(s.ordered_groups(s.worker_items(0, 0))))])
    s.load(None)
    s.begin()
    again = _texts([next(iter(s.ordered_groups(s.worker_items(0, 0))))])
    assert first == again
    assert s.initial_state()["step"] == 0


def test_finite_drop_last_counts_the_tail(text_dir):
    s = _session(text_dir, drop_last=True)
    delivered = _texts(s.ordered_groups(_round_robin(s.worker_items(2, w) for w in range(2))))
    assert len(delivered) % 8 == 0  # whole global steps only (4 lanes x 2 rows)
    assert len(delivered) + s.dropped_rows == N_DOCS  # nothing vanishes: what is not delivered is counted
    assert len(set(delivered)) == len(delivered)


def test_agreement_without_a_process_group_is_local():
    a = StepAgreement()
    assert a.agree(True) is True and a.agree(False) is False


def test_worker_lanes_keep_round_robin_order():
    assert worker_lanes([0, 1, 2, 3], 2, 0) == [0, 2]
    assert worker_lanes([0, 1, 2, 3], 3, 2) == []  # 3 does not divide 4: two workers share the lanes
    assert worker_lanes([4, 5, 6], 0, 0) == [4, 5, 6]


def test_text_only_pipeline_through_zephon_torch(text_dir):
    torch = pytest.importorskip("torch")
    zephon_torch = pytest.importorskip("zephon_torch")
    want = None
    for nw in (0, 2):
        ds = zephon_torch.ZephonIterableDataset([open_dataset(text_dir)], [Decode("text"), Batch(2, drop_last=False)],
                                                 dp_degree=1, dp_rank=0, canonical_replicas=4, chunk_size=8,
                                                 exhaustion="stop", seed=3)
        dl = zephon_torch.DataLoader(ds, num_workers=nw)
        got = []
        for mb in dl:
            assert isinstance(mb["__lane__"], torch.Tensor) and len(mb["__lane__"]) == len(mb["text"])
            assert len(mb["text"]) == 4 * 2  # every lane fills every micro-batch, padding at the pass's end
            pad = mb.get("__pad__", torch.zeros(len(mb["text"]), dtype=torch.bool)).tolist()
            assert all(t == "" for t, p in zip(mb["text"], pad) if p)
            got.extend(t for t, p in zip(mb["text"], pad) if not p)
        assert sorted(got) == sorted(f"document number {i}" for i in range(N_DOCS))
        want = want or got
        assert got == want
        assert dl.state_dict()["lanes"]


@pytest.mark.parametrize("field,value", [("step", 5), ("canonical_replicas", 8), ("rows_per_lane_step", 3),
                                         ("config", "seed")])
def test_edited_fields_outside_the_lane_entries_are_refused(text_dir, field, value):
    s = _session(text_dir)
    next(iter(s.ordered_groups(s.worker_items(0, 0))))
    state = json.loads(json.dumps(s.rank_state()))
    if field == "config":
        state["config"]["work"]["seed"] += 1  # the fingerprint still matches: only the summary was edited
    else:
        state[field] = value
    with pytest.raises(CheckpointError, match="edited"):
        _session(text_dir).load(state)
