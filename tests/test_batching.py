"""zephon.work.batching: the per-slot composition of steps behind Mosaic's ``batching_method``.

Oracles: counts worked out by hand from Mosaic's rounding rule (floor, then the largest remainders, ties to the
higher stream), and counting the composition's own output with numpy (for ``count``); the lanes' pointers of a
``WorkSource`` cut into steps here.
"""
from __future__ import annotations

from collections import Counter

import numpy as np
import pytest

from zephon.work import Schedule, WorkSource, stratified_counts
from zephon.work.batching import composition, epoch_steps


class Data:
    def __init__(self, name, shard_sizes):
        self.name, self.shard_sizes = name, shard_sizes

    def fingerprint(self):
        return {"name": self.name, "shards": self.shard_sizes}

    def read(self, *_):  # never called: these tests build sources and plans only
        raise AssertionError("no I/O expected")


@pytest.mark.parametrize("proportions,step,want", [
    ([5, 3, 2], 8, [4, 2, 2]),        # 4, 2.4, 1.6: the free slot to the largest remainder (.6)
    ([1, 1, 1], 4, [1, 1, 2]),        # equal remainders: Mosaic's flipped argsort gives it to the last stream
    ([1, 1, 1], 5, [1, 2, 2]),
    ([0.7, 0.2, 0.1], 10, [7, 2, 1]),
    ([240, 120, 80], 8, [4, 2, 2]),   # 4.36, 2.18, 1.45
])
def test_stratified_counts_round_as_mosaic(proportions, step, want):
    assert stratified_counts(proportions, step) == want


def test_stratified_refuses_a_stream_with_no_slot():
    with pytest.raises(ValueError, match="dataset 1 gets 0 of the 4 slots"):
        stratified_counts([100, 1], 4)


@pytest.mark.parametrize("method", ["stratified", "per_stream", "device_per_stream"])
def test_count_agrees_with_assign_and_draws_are_used_once(method):
    comp = composition(method, [5, 3, 2], step_size=8, canonical_replicas=4, seed=11)
    d, k = comp.assign(np.arange(800))
    for ds in range(3):
        mine = k[d == ds]
        assert sorted(mine.tolist()) == list(range(mine.size)), "each draw index once, none skipped"
        for u in (0, 1, 5, 8, 13, 79, 80, 81, 400, 799, 800):
            assert comp.count(ds, u) == int(np.count_nonzero(d[:u] == ds)), (ds, u)


def test_block_rounds_hold_exact_shares_in_a_seeded_order():
    comp = composition("per_stream", [5, 3, 2], step_size=8, canonical_replicas=4, seed=1)
    d, _ = comp.assign(np.arange(8 * 10 * 6))
    steps = d.reshape(-1, 8)
    assert all(len(set(s.tolist())) == 1 for s in steps), "one dataset per step"
    rounds = steps[:, 0].reshape(-1, 10)
    assert all(Counter(r.tolist()) == {0: 5, 1: 3, 2: 2} for r in rounds)
    assert len({tuple(r.tolist()) for r in rounds}) > 1, "each round is shuffled on its own"
    other = composition("per_stream", [5, 3, 2], step_size=8, canonical_replicas=4, seed=2)
    assert not np.array_equal(other.assign(np.arange(80))[0], d[:80])


@pytest.mark.parametrize("method,want", [
    ("stratified", 48),                # 4.57, 2.29, 1.14 -> counts [5, 2, 1]: min(240 // 5, 120 // 2, 60 // 1)
    ("per_stream", 30 + 15 + 7),       # whole global batches of each
    ("device_per_stream", (120 + 60 + 30) // 4),  # lane steps of 2 rows, cut to whole steps of 4 lanes
])
def test_epoch_steps_never_draw_a_sample_twice(method, want):
    choose = [240, 120, 60]
    steps, weights = epoch_steps(method, choose, [240, 120, 60], step_size=8, canonical_replicas=4)
    assert steps == want
    comp = composition(method, weights, step_size=8, canonical_replicas=4, seed=3)
    d, _ = comp.assign(np.arange(steps * 8))
    got = Counter(d.tolist())
    assert all(got[i] <= c for i, c in enumerate(choose)), got


@pytest.mark.parametrize("method", ["stratified", "per_stream", "device_per_stream"])
def test_work_source_steps_follow_the_composition_at_any_chunk_size(method):
    """The lanes' pointers, cut into steps here (lane l's rows of step s are its positions 2s, 2s + 1), give
    the source's composition slot for slot (slot = lane * 2 + row), at every chunk size."""
    data = [Data("a", [50, 50]), Data("b", [30]), Data("c", [20])]
    for chunk in (1, 3, 8):
        src = WorkSource(data, [5, 3, 2], seed=0, canonical_replicas=4, chunk_size=chunk, step_size=8,
                         batching=method)
        want = src.mixture.assign(np.arange(8 * 12))[0].reshape(12, 8)
        lanes = [np.concatenate([src.chunk(lane, c).dataset_ids for c in range(-(-24 // chunk))])[:24]
                 for lane in range(4)]
        got = np.stack([np.concatenate([lanes[lane][s * 2:s * 2 + 2] for lane in range(4)]) for s in range(12)])
        assert np.array_equal(got, want), chunk
        if method == "per_stream":
            assert all(len(set(r.tolist())) == 1 for r in got)
        if method == "device_per_stream":
            assert all(len(set(r[j:j + 2].tolist())) == 1 for r in got for j in range(0, 8, 2))
            assert len({tuple(r.tolist()) for r in got}) > 1
        if method == "stratified":
            assert all(r.tolist() == [0, 0, 0, 0, 1, 1, 2, 2] for r in got)


def test_work_source_refuses_batching_without_an_endless_stream_or_with_a_schedule():
    data = [Data("a", [10]), Data("b", [10])]
    with pytest.raises(ValueError, match="endless stream"):
        WorkSource(data, [1, 1], canonical_replicas=2, step_size=4, exhaustion="stop", batching="per_stream")
    with pytest.raises(ValueError, match="a schedule"):
        WorkSource(data, Schedule([1, 1]), canonical_replicas=2, step_size=4, batching="stratified")
    with pytest.raises(ValueError, match="multiple of canonical_replicas"):
        WorkSource(data, [1, 1], canonical_replicas=2, step_size=3, batching="stratified")
    with pytest.raises(ValueError, match="batching must be one of"):
        WorkSource(data, [1, 1], batching="round_robin")


def test_loader_refuses_batching_with_operators_that_move_records_across_slots():
    from zephon import Batch, Decode, LoaderPlan, Pack, Shuffle, Tokenize
    from zephon.ops import ByteTokenizer, Filter

    data = [Data("a", [10]), Data("b", [10])]
    tok = Tokenize(ByteTokenizer(), add_eos=False, max_length=16)
    for ops, names in (([Shuffle(4)], "'shuffle'"), ([tok, Pack(16)], "'tokenize', 'pack'"),
                       ([Filter(lambda r: True)], "'filter'")):
        with pytest.raises(ValueError, match=f"operators \\[{names}\\] move, merge, split or drop"):
            LoaderPlan.build(data, [Decode(), *ops, Batch(1)], canonical_replicas=2, batching="per_stream")
    LoaderPlan.build(data, [Decode(), Shuffle(4), Batch(1)], canonical_replicas=2)  # random: any operators
