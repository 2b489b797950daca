"""host.StepAssembly: lane items interleaved arbitrarily (per-lane order kept) come out in rank order."""
from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from zephon.checkpoint import LaneCursor
from zephon.host import StepAssembly


@st.composite
def arrivals(draw):
    lanes = draw(st.lists(st.integers(0, 63), min_size=1, max_size=6, unique=True))
    m = draw(st.integers(1, 3))
    rps = m * draw(st.integers(1, 3))
    starts = {lane: draw(st.integers(0, 3 * rps)) for lane in lanes}  # ragged: mid-step, mid-micro
    end = 4 * rps
    per_lane = {}
    for lane in lanes:
        items, d = [], starts[lane]
        while d < end:  # the Loader's micro-batches: partial first one after a mid-micro start
            step, micro = divmod(d, rps)[0], (d % rps) // m
            n = min((micro + 1) * m - d % rps, end - d)
            items.append((step, micro, lane, n))
            d += n
        per_lane[lane] = items
    # a random interleaving that keeps each lane's order (as workers' streams do)
    order = draw(st.permutations([lane for lane in lanes for _ in per_lane[lane]]))
    cursors = dict.fromkeys(lanes, 0)
    seq = []
    for lane in order:
        seq.append(per_lane[lane][cursors[lane]])
        cursors[lane] += 1
    entries = [LaneCursor(lane, delivered_rows=starts[lane]) for lane in lanes]
    return lanes, entries, rps, m, seq


@settings(max_examples=200, deadline=None)
@given(arrivals())
def test_groups_come_out_in_step_micro_lane_order(case):
    lanes, entries, rps, m, seq = case
    asm = StepAssembly(lanes, entries, rps, m)
    out = []
    for item in seq:
        for group in asm.add(item[0], item[1], item[2], item):
            out.append(group)
    out.extend(asm.finish())
    flat = [it for g in out for it in g]
    assert sorted(flat) == sorted(seq)  # every item exactly once
    rank = {lane: i for i, lane in enumerate(lanes)}
    assert flat == sorted(seq, key=lambda it: (it[0], it[1], rank[it[2]]))
    for g in out:  # one (step, micro) per group
        assert len({(it[0], it[1]) for it in g}) == 1


def test_multi_item_parts_are_released_only_when_last():
    asm = StepAssembly([0, 1], [LaneCursor(0), LaneCursor(1)], 1, 1)
    assert asm.add(0, 0, 0, "a0", last=False) == []
    assert asm.add(0, 0, 1, "b0") == []
    assert asm.add(0, 0, 0, "a1") == [["a0", "a1", "b0"]]
