"""Per-rank checkpoints: every rank saves only its lanes, a restore at another dp reads only the entries it needs.

Oracles: which old ranks hold a lane is found here by brute force over every old rank's lanes; the global batches
come from an uninterrupted dp 1 run, keyed by (step, lane) with the rows' text in delivery order, collected by the
test. The simulation is ``benchmarks.ranks`` (ranks in one process, tiny data); the 1,024-rank one is slow:
``pytest -m slow tests/test_rank_states.py``.
"""
from __future__ import annotations

import json
import math
from collections import defaultdict

import pytest

from benchmarks.ranks import base_plan, restore_all, rank_loader, run_rank, save_all, write_corpus
from zephon.checkpoint import CheckpointError, merge_states
from zephon.host import (SavedRanks, load_rank_states, rank_checkpoint, rank_entries_needed, restorable,
                         save_rank_state)
from zephon.work import TopologyError, lanes_for_rank


class Rows:
    """(step, lane) -> the rows' texts in the order ranks (in rank order) delivered them."""

    def __init__(self):
        self.rows = defaultdict(list)

    def __call__(self, mb):
        self.rows[(mb["__step__"], mb["__lane__"])].extend(mb["text"])


def _reference(plan, steps):
    rows = Rows()
    L = rank_loader(plan, 1, 0)
    run_rank(L, steps, rows)
    L.close()
    assert len(rows.rows) == steps * plan.canonical_replicas
    return rows.rows


def _brute(saved_dp, new_dp, new_rank, lanes, assignment="contiguous"):
    mine = set(lanes_for_rank(lanes, new_dp, new_rank, assignment))
    holders = {}
    for old in range(saved_dp):
        for lane in lanes_for_rank(lanes, saved_dp, old, assignment):
            holders.setdefault(lane, old)  # the first of ranks sharing a lane
    return sorted({holders[lane] for lane in mine})


@pytest.mark.parametrize("assignment", ["contiguous", "interleaved"])
def test_rank_entries_needed_matches_brute_force_and_the_bound(assignment):
    lanes = 48
    dps = [1, 2, 3, 4, 6, 8, 12, 16, 24, 48, 96, 144]
    for saved in dps:
        for new in dps:
            for r in range(new):
                got = rank_entries_needed(saved, new, r, lanes, saved_assignment=assignment,
                                          new_assignment=assignment)
                assert got == _brute(saved, new, r, lanes, assignment), (saved, new, r)
                if assignment == "contiguous" or saved % new == 0 or new % saved == 0:
                    assert len(got) <= math.ceil(saved / new) + 1
    with pytest.raises(TopologyError, match=r"valid dp degrees are \[1, 2, 3, 4, 6, 8, 12, 16, 24, 48\]"):
        rank_entries_needed(48, 10, 0, lanes)


def _check_scale(corpus, lanes, dp, restores, refused):
    """Save at ``dp`` after 2 steps; each restore dp reads only its entries and gives the reference's step 2-3."""
    plan = base_plan(corpus, lanes, rows_per_lane_step=2)
    ref = _reference(plan, 4)
    store, written = save_all(plan, dp, 2)
    # O(lanes per rank): every entry within a few bytes of the others, whatever the rank count
    assert max(written) - min(written) < 64 and max(written) < 600 * lanes // dp
    # the per-rank entries merge into what a merged checkpoint of the same run holds
    merged = merge_states([json.loads(b)["state"] for b in store.values()])
    assert [e["delivered_rows"] for e in merged["lanes"]] == [4] * lanes
    out = {}
    for new_dp in restores:
        rows = Rows()
        got = restore_all(plan, store, dp, new_dp, 2, on_batch=rows, mem_ranks={0})
        assert dict(rows.rows) == {k: v for k, v in ref.items() if k[0] >= 2}, new_dp
        assert max(got["entries"]) <= math.ceil(dp / new_dp) + 1
        assert max(got["bytes_read"]) <= (math.ceil(dp / new_dp) + 1) * max(written)
        out[new_dp] = got
    divisors = r"dp_degree=%d does not divide.*valid dp degrees are \[1, 2, 4, " % refused
    with pytest.raises(TopologyError, match=divisors):
        load_rank_states(lambda r: json.loads(store[r]), dp, refused, 0, lanes)
    return written, out


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    return write_corpus(str(tmp_path_factory.mktemp("ranks")), docs=6000)


def test_64_ranks_256_lanes_restore_at_32_and_128_and_16_ranks_at_128_sharing(corpus):
    written, out = _check_scale(corpus, 256, 64, (32, 128), 100)
    small, shared = _check_scale(corpus, 64, 16, (8, 128), 10)
    assert abs(max(written) - max(small)) < 64  # bytes per rank flat in the rank count (4 lanes per rank)
    assert max(out[128]["entries"]) == 1 and max(out[32]["entries"]) == 2 and max(shared[128]["entries"]) == 1


@pytest.mark.slow  # 4-9 min on the loaded shared 2 cores: 1,024 + 512 + 2,048 + 8,192 simulated ranks
def test_1024_ranks_4096_lanes(corpus):
    written, out = _check_scale(corpus, 4096, 1024, (512, 2048, 8192), 1000)
    assert max(out[512]["entries"]) == 2 and max(out[2048]["entries"]) == 1


def test_restore_memory_does_not_grow_with_the_lane_count(corpus):
    """A rank restoring 4 lanes from 2 entries: the same peak memory with 64 or 8,192 lanes in the job."""
    import tracemalloc

    peaks = []
    for lanes in (64, 8192):
        plan, dp = base_plan(corpus, lanes), lanes // 4
        entries = {}
        for r in (0, 1):  # only the two ranks the restoring rank 0 of dp / 2 needs
            L = rank_loader(plan, dp, r)
            run_rank(L, 1)
            entries[r] = json.dumps(save_rank_state(L.checkpoint(), dp, r))
            L.close()
        tracemalloc.start()
        state = load_rank_states(lambda r: json.loads(entries[r]), dp, dp // 2, 0, lanes)
        peaks.append(tracemalloc.get_traced_memory()[1])
        tracemalloc.stop()
        assert [e["lane"] for e in state["lanes"]] == list(range(8))
    assert peaks[1] < peaks[0] + 8192, peaks  # O(lanes read), not O(canonical_replicas)


def test_load_rank_states_reads_only_what_it_needs_and_names_bad_entries(corpus):
    plan = base_plan(corpus, 8)
    store, _ = save_all(plan, 4, 1)
    asked = []

    def read(r):
        asked.append(r)
        return json.loads(store[r])

    state = load_rank_states(read, 4, 2, 1, 8)
    assert asked == [2, 3] and sorted(e["lane"] for e in state["lanes"]) == [4, 5, 6, 7]
    entries = {r: json.loads(b) for r, b in store.items()}
    with pytest.raises(CheckpointError, match="old rank 0's entry was saved as rank 0 of dp 4"):
        load_rank_states(lambda r: entries[r], 2, 2, 0, 8)
    with pytest.raises(CheckpointError, match="old rank 1's entry is not a Zephon rank state"):
        load_rank_states(lambda r: {"lanes": []}, 4, 8, 2, 8)
    with pytest.raises(CheckpointError, match="not a Zephon checkpoint"):
        save_rank_state([], 4, 0)


def test_saved_ranks_from_a_directory_reads_only_the_files_it_needs(corpus, tmp_path):
    """``SavedRanks.from_directory``: the saved dp is the number of entry files; a new rank reads only the old ranks
    holding its lanes (8 contiguous lanes, dp 4 -> 2: rank 1 owns lanes 4-7, held by old ranks 2 and 3), whether
    the files are ``save_rank_state`` entries or ``rank_checkpoint`` states (a StatefulDataLoader's)."""
    plan = base_plan(corpus, 8)
    store, _ = save_all(plan, 4, 1)
    entries = {r: json.loads(b) for r, b in store.items()}
    for form in ("entry", "checkpoint"):
        d = tmp_path / form
        d.mkdir()
        for r, e in entries.items():
            obj = e if form == "entry" else rank_checkpoint(e["state"], 4, r)
            (d / f"rank-{r}.json").write_text(json.dumps(obj))
        saved = SavedRanks.from_directory(str(d))
        assert saved.saved_dp == 4
        state = restorable(saved, plan.for_rank(2, 1))
        assert saved.read == [2, 3], form
        assert sorted(e["lane"] for e in state["lanes"]) == [4, 5, 6, 7]
        assert entries[2]["state"]["lanes"] + entries[3]["state"]["lanes"] == state["lanes"]
    (tmp_path / "entry" / "rank-1.json").unlink()
    with pytest.raises(CheckpointError, match=r"not ranks 0\.\.3: missing \['rank-1\.json'\]"):
        SavedRanks.from_directory(str(tmp_path / "entry"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(CheckpointError, match="no per-rank entries"):
        SavedRanks.from_directory(str(tmp_path / "empty"))


def test_a_rank_state_of_another_topology_names_the_old_ranks_needed(corpus):
    plan = base_plan(corpus, 8)
    store, _ = save_all(plan, 4, 1)
    e3 = json.loads(store[3])
    with pytest.raises(CheckpointError, match=r"rank 3 of dp 4 .*needs the states of old ranks \[0, 1\]"):
        restorable(e3, plan.for_rank(2, 0))
    with pytest.raises(CheckpointError, match=r"rank 3 of dp 4 .*needs the states of old ranks \[0, 1\]"):
        restorable(rank_checkpoint(e3["state"], 4, 3), plan.for_rank(2, 0))
    assert restorable(e3, plan.for_rank(4, 3)) == e3["state"]  # its own topology: its state
    # a rank's own state that holds the lanes of a rank at another dp restores as is (dp 4 rank 3 -> dp 8 rank 7)
    own = rank_checkpoint(e3["state"], 4, 3)
    assert restorable(own, plan.for_rank(8, 7)) is own


def test_rank_states_of_different_saves_are_refused(corpus, tmp_path):
    """A rank's state left from an earlier save (rank 1 saved at step 2, rank 0 at step 9: a rank died while saving
    over fixed rank-{r}.json paths) is refused, whether merged (``merge_states``), restored from a list, or read
    from a directory at the same dp (each rank then needs only its own file: the next old rank's entry is read to
    check). States one step apart (a rank interrupted inside the next step) still merge."""
    from zephon.host import RankSession

    plan = base_plan(corpus, 8)
    early, _ = save_all(plan, 2, 2)
    late, _ = save_all(plan, 2, 9)
    mixed = {0: json.loads(late[0]), 1: json.loads(early[1])}
    with pytest.raises(CheckpointError, match=r"different saves: state 1 is at step 2 and state 0 at step 9"):
        merge_states([mixed[0]["state"], mixed[1]["state"]])
    with pytest.raises(CheckpointError, match="different saves"):
        RankSession(plan).load([mixed[0]["state"], mixed[1]["state"]])  # a host's restore of a list
    d = tmp_path / "mixed"
    d.mkdir()
    for r, e in mixed.items():
        (d / f"rank-{r}.json").write_text(json.dumps(e))
    for new_rank in (0, 1):
        saved = SavedRanks.from_directory(str(d))
        with pytest.raises(CheckpointError, match=r"old rank 1's entry is at step 2 and old rank 0's entry at step "
                                                  r"9 \(7 steps apart"):
            restorable(saved, plan.for_rank(2, new_rank))
        assert saved.read == [new_rank] and saved.checked == [1 - new_rank]
    # one step apart (rank 1 a step ahead): one save, merged and restored
    ahead, _ = save_all(plan, 2, 3)
    merged = merge_states([json.loads(early[0])["state"], json.loads(ahead[1])["state"]])
    assert merged["step"] == 2


def test_a_missing_rank_file_is_named(corpus, tmp_path):
    """The last rank's file gone (a save at dp 2 with only rank-0.json left): the error names the missing file,
    not a topology mismatch."""
    plan = base_plan(corpus, 8)
    store, _ = save_all(plan, 2, 2)
    (tmp_path / "rank-0.json").write_bytes(store[0])
    saved = SavedRanks.from_directory(str(tmp_path))
    with pytest.raises(CheckpointError, match=r"rank-0\.json was saved at dp 2, but .* holds 1 per-rank entries "
                                              r"\(rank-\{rank\}\.json\): missing \['rank-1\.json'\]"):
        restorable(saved, plan.for_rank(4, 0))
