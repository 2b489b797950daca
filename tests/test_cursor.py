"""checkpoint.LaneCursor: its arithmetic (step, row in step, micro-batch, sentinel pointer), its JSON round trip, and
that ``make_state`` / ``validate`` write and read lane entries through it. Expected values are worked out by hand."""
from __future__ import annotations

import hashlib

import pytest

from zephon.checkpoint import (CheckpointError, LaneCursor, canonical_json, first_step, make_state,
                               validate)

CARRY = {"1": [[7, [8, 2]], [9]]}
# lane 3, sentinel at chunk 2 offset 64, 5 rows of that span delivered, 1000 rows delivered in all
CURSOR = LaneCursor(3, sentinel_chunk=2, sentinel_offset=64, replay_cursor=5, delivered_rows=1000, carry=CARRY)


def test_step_arithmetic():
    # 96 rows per lane step: 10 steps are 960 rows, so row 1000 is row 40 of step 10
    assert CURSOR.step(96) == 10
    assert CURSOR.in_step(96) == 40
    assert CURSOR.position(96, 8) == (10, 5)  # 40 rows = 5 micro-batches of 8
    assert CURSOR.step(1000) == 1 and CURSOR.in_step(1000) == 0  # exactly on a step boundary
    assert CURSOR.step(1001) == 0 and CURSOR.in_step(1001) == 1000
    # 6 rows per lane step in micro-batches of 2: (step, micro) of the next row after d rows delivered
    expected = [(0, 0), (0, 0), (0, 1), (0, 1), (0, 2), (0, 2), (1, 0), (1, 0), (1, 1)]
    assert [LaneCursor(0, delivered_rows=d).position(6, 2) for d in range(9)] == expected


def test_sentinel_pointer_and_span_constructor():
    assert CURSOR.first_pointer(256) == 2 * 256 + 64 == 576
    assert CURSOR.first_pointer(64) == 2 * 64 + 64 == 192
    # span 9 of 64 pointers starts at pointer 576 = chunk 2 (of 256) + 64
    c = LaneCursor.at_span(3, 9, 5, 1000, span=64, chunk_size=256, carry=CARRY)
    assert c == CURSOR
    assert (c.sentinel_chunk, c.sentinel_offset) == (2, 64)
    # span 4 of 512 pointers starts at pointer 2048 = chunk 8 of 256, offset 0
    d = LaneCursor.at_span(1, 4, 0, 7, span=512, chunk_size=256, carry={})
    assert (d.sentinel_chunk, d.sentinel_offset, d.replay_cursor, d.delivered_rows, d.carry) == (8, 0, 0, 7, None)


def test_first_step():
    cursors = [LaneCursor(0, delivered_rows=1000), LaneCursor(1, delivered_rows=200), LaneCursor(2, delivered_rows=95)]
    assert first_step(cursors, 96) == 0  # 95 rows: lane 2 is still in step 0
    assert first_step(cursors[:2], 96) == 2  # 200 rows = 2 steps + 8 rows
    assert first_step([], 96) == 0


def test_json_round_trip_keeps_keys_and_order():
    d = CURSOR.to_dict()
    assert list(d) == ["lane", "sentinel_chunk", "sentinel_offset", "replay_cursor", "delivered_rows", "carry"]
    assert d == {"lane": 3, "sentinel_chunk": 2, "sentinel_offset": 64, "replay_cursor": 5, "delivered_rows": 1000,
                 "carry": {"1": [[7, [8, 2]], [9]]}}
    assert LaneCursor.from_dict(d) == CURSOR
    fresh = LaneCursor.fresh(4).to_dict()
    assert fresh == {"lane": 4, "sentinel_chunk": 0, "sentinel_offset": 0, "replay_cursor": 0, "delivered_rows": 0}
    assert "carry" not in fresh  # carried only when set
    with pytest.raises(CheckpointError, match="replay_cursor exceeds delivered_rows"):
        LaneCursor.from_dict(dict(d, replay_cursor=1001))


def test_make_state_writes_cursors_and_validate_reads_them_back():
    old_entries = [  # lane entries as a checkpoint written before cursors went end to end holds them
        {"lane": 1, "sentinel_chunk": 0, "sentinel_offset": 128, "replay_cursor": 3, "delivered_rows": 99},
        {"lane": 0, "sentinel_chunk": 1, "sentinel_offset": 0, "replay_cursor": 0, "delivered_rows": 192,
         "carry": {"0": [[4]]}},
    ]
    summary = {"version": 1}
    from_dicts = make_state("fp", summary, 2, 96, old_entries)
    from_cursors = make_state("fp", summary, 2, 96, [LaneCursor.from_dict(e) for e in old_entries])
    assert from_dicts == from_cursors
    lanes_json = ('[{"carry":{"0":[[4]]},"delivered_rows":192,"lane":0,"replay_cursor":0,"sentinel_chunk":1,'
                  '"sentinel_offset":0},{"delivered_rows":99,"lane":1,"replay_cursor":3,"sentinel_chunk":0,'
                  '"sentinel_offset":128}]')
    assert canonical_json(from_dicts["lanes"]) == lanes_json  # sorted by lane, same keys
    assert from_dicts["lanes_sha256"] == hashlib.sha256(lanes_json.encode()).hexdigest()
    assert from_dicts["step"] == 1  # lane 1: 99 rows = step 1 (+3 rows); lane 0: 192 rows = step 2
    by_lane = validate(from_dicts, "fp", summary, lanes=[0, 1])
    assert by_lane == {0: LaneCursor(0, 1, 0, 0, 192, {"0": [[4]]}), 1: LaneCursor(1, 0, 128, 3, 99)}
    assert [by_lane[lane].to_dict() for lane in (0, 1)] == sorted(old_entries, key=lambda e: e["lane"])


def test_padded_steps_pads_from_the_lanes_cursors():
    """``host.padded_steps`` reads each lane's start cursor: 4 rows per lane step in micro-batches of 2; lane 0
    delivers step 0, lane 1 delivers nothing and starts either at row 0 or after micro-batch 0 (a mid-step
    checkpoint). Lane 1 gets a padding item exactly for the micro-batches it still owes, its entry counting
    the rows up to them (by hand: 2 after micro 0, 4 after micro 1)."""
    from zephon.host import StepAgreement
    from zephon.host.agreement import padded_steps

    items = [[({"lane": 0, "step": 0, "micro": j, "rows": 2, "last": True,
                "state": LaneCursor(0, delivered_rows=2 * (j + 1)).to_dict()}, f"a{j}")] for j in (0, 1)]

    def padding(lane, step, micro, state):
        return {"lane": lane, "step": step, "micro": micro, "state": state}, "pad"

    def run(lane1_start):
        cursors = [LaneCursor(0), LaneCursor(1, delivered_rows=lane1_start)]
        out = list(padded_steps(iter(items), [0, 1], cursors, 4, 2, StepAgreement(), padding))
        return [[(m["lane"], m["micro"], m["state"]["delivered_rows"], p) for m, p in g] for g in out]

    assert run(0) == [[(0, 0, 2, "a0"), (1, 0, 2, "pad")], [(0, 1, 4, "a1"), (1, 1, 4, "pad")]]
    assert run(2) == [[(0, 0, 2, "a0")], [(0, 1, 4, "a1"), (1, 1, 4, "pad")]]
    assert run(4) == [[(0, 0, 2, "a0")], [(0, 1, 4, "a1")]]  # lane 1 owes nothing of step 0
