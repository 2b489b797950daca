"""Mixture schedules (zephon.work.schedule / ScheduledMixture) through the WorkSource and the Loader.

Every expected count comes from the schedule alone, integrated in this file with ``fractions.Fraction``
(Energon's step/linear semantics evaluated here, not by the code under test); batches are compared with an
uninterrupted single-rank run.
"""
from __future__ import annotations

import json
import math
from fractions import Fraction

import numpy as np
import pytest

from zephon import Batch, CheckpointError, Loader, Schedule, merge_states, open_dataset
from zephon.work import ScheduledMixture, WorkSource

from helpers import schedule_weight

SIZES = {"web": 400, "code": 250, "math": 150}


def spec_three_phases():
    """web / code / math: phase 1 (0-39) 3:1:0, a ramp (40-79) to 1:2:1 (total stays 4), phase 3 (80-119)
    1:2:1, then math leaves (120-): 1:2:0."""
    return [{"linear": {0: 3, 40: 3, 80: 1}}, {"linear": {0: 1, 40: 1, 80: 2}},
            {"linear": {0: 0, 40: 0, 80: 1, 119: 1, 120: 0}}]


def oracle_shares(spec, step):
    w = [schedule_weight(s, step) for s in spec]
    return [x / sum(w) for x in w]


def bound(num_datasets):
    return max(1, math.ceil(math.log2(num_datasets)))


@pytest.fixture(scope="module")
def data_dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp("sched")
    dirs = []
    for name, n in SIZES.items():
        d = root / name
        d.mkdir()
        with open(d / "part-0.jsonl", "w") as f:
            for i in range(n):
                f.write(json.dumps({"text": f"{name}-{i}"}) + "\n")
        dirs.append(str(d))
    return dirs


def make(dirs, schedule, *, dp=1, rank=0, lanes=8, gbs=16, chunk_size=16, micro=2, seed=3):
    return Loader([open_dataset(d) for d in dirs], [Batch(micro)], weights=schedule, seed=seed,
                  canonical_replicas=lanes, chunk_size=chunk_size, global_batch_size=gbs, dp_degree=dp,
                  dp_rank=rank, runner="inline")


def run(loaders, steps):
    """``steps`` global steps pulled from every rank in turn: ``{step: {lane: [(dataset, shard, sample,
    pass, text), ...]}}``; the loaders keep their position (call ``checkpoint`` after)."""
    out = {}
    its = [iter(L) for L in loaders]
    for _ in range(steps):
        for L, it in zip(loaders, its):
            for _ in range(len(L.lanes) * (L.rows_per_lane_step // L.batch.micro_batch_size)):
                mb = next(it)
                rows = out.setdefault(mb["__step__"], {}).setdefault(mb["__lane__"], [])
                rows += [(*src, text) for src, text in zip(mb["__src__"], mb["text"])]
    return out


# ---------------------------------------------------------------- the schedule itself


def test_parsing_follows_energon_step_and_linear_semantics():
    s = Schedule(spec_three_phases())
    for step in (0, 39, 40, 41, 59, 79, 80, 100, 119, 120, 500):
        assert list(s.shares(step)) == oracle_shares(spec_three_phases(), step), step
    assert s.segments[-1][0] == 120 and s.segments[-1][1] is None
    # string step keys (YAML / JSON) and exact fractions round-trip through to_dict
    again = Schedule.from_dict(json.loads(json.dumps(s.to_dict())))
    assert again == s and again.first_difference(s) is None


@pytest.mark.parametrize("bad, says", [
    ([{"step": {0: 0}}, 0], "every dataset's weight is 0 at step 0"),
    ([{"cosine": {0: 1}}, 1], "expected a number"),
    ([{"step": {-1: 1}}, 1], "integers >= 0"),
    ([{"linear": {0: -1}}, 1], ">= 0"),
    ([{"linear": {}}, 1], "non-empty"),
])
def test_malformed_schedules_are_refused(bad, says):
    with pytest.raises(ValueError, match=says):
        Schedule(bad)


def test_first_difference_names_the_step():
    base = spec_three_phases()
    assert Schedule(base).first_difference(Schedule(base)) is None
    later = [dict(base[0]), base[1], base[2]]
    later[0] = {"linear": {0: 3, 40: 3, 80: 1, 300: 1, 400: 5}}  # ramp appended from step 300
    assert Schedule(base).first_difference(Schedule(later)) == 301
    assert Schedule(base).first_difference(Schedule(base, positions_per_step=32)) == 0


# ---------------------------------------------------------------- counts against the integral


def _check_counts(counts_per_step, spec, gbs, num_datasets):
    """Every step: per-dataset cumulative counts within ceil(log2 D) of the integral of the shares, per-step
    counts within twice that of gbs x share."""
    b = bound(num_datasets)
    cum = [0] * num_datasets
    integral = [Fraction(0)] * num_datasets
    worst = 0.0
    for step, counts in enumerate(counts_per_step):
        shares = oracle_shares(spec, step)
        assert sum(counts) == gbs
        for d in range(num_datasets):
            cum[d] += counts[d]
            integral[d] += gbs * shares[d]
            assert abs(cum[d] - integral[d]) < b, (step, d, cum[d], integral[d])
            assert abs(counts[d] - gbs * shares[d]) < 2 * b, (step, d, counts[d], gbs * shares[d])
            worst = max(worst, float(abs(cum[d] - integral[d])))
    return worst


def test_mixture_counts_stay_within_the_bound_at_every_position():
    spec, gbs = spec_three_phases(), 8
    mix = ScheduledMixture(Schedule(spec), gbs)
    ds, draws = mix.assign(np.arange(200 * gbs))
    per_step = [np.bincount(ds[s * gbs:(s + 1) * gbs], minlength=3).tolist() for s in range(200)]
    _check_counts(per_step, spec, gbs, 3)
    integral = [Fraction(0)] * 3
    for u in range(200 * gbs):  # within the bound at every position, not only at step ends
        shares = oracle_shares(spec, u // gbs)
        integral = [g + p for g, p in zip(integral, shares)]
        for d in range(3):
            assert abs(int((ds[:u + 1] == d).sum()) - integral[d]) < bound(3)
    for d in range(3):  # the k-th draw of a dataset is its k-th position: no draw skipped or repeated
        assert draws[ds == d].tolist() == list(range(int((ds == d).sum())))
    assert [mix.count(d, 137 * gbs + 5) for d in range(3)] == np.bincount(ds[:137 * gbs + 5], minlength=3).tolist()
    assert int((ds[120 * gbs + 2 * gbs:] == 2).sum()) == 0  # math is gone once the lag of its group is absorbed


def test_loader_steps_follow_the_schedule_integral(data_dirs):
    """A real Loader (8 lanes, one sample per row, no shuffle buffer): each global step's per-dataset counts
    against the integral of the schedule, at every step of the three phases, the ramp and the exit."""
    gbs, steps = 16, 140
    L = make(data_dirs, Schedule(spec_three_phases()), gbs=gbs)
    batches = run([L], steps)
    per_step = [np.bincount([r[0] for lane in sorted(batches[s]) for r in batches[s][lane]], minlength=3).tolist()
                for s in range(steps)]
    worst = _check_counts(per_step, spec_three_phases(), gbs, 3)
    assert worst > 0  # the oracle is not vacuous: counts are integers, the integral is not
    assert sum(c[2] for c in per_step[:40]) == 0  # math enters with the ramp
    L.close()


# ---------------------------------------------------------------- elasticity and resume


@pytest.fixture(scope="module")
def reference(data_dirs):
    L = make(data_dirs, Schedule(spec_three_phases()))
    out = run([L], 100)
    L.close()
    return out


@pytest.mark.parametrize("dp", [2, 4, 8])
def test_global_batches_are_identical_at_every_dp(data_dirs, reference, dp):
    ranks = [make(data_dirs, Schedule(spec_three_phases()), dp=dp, rank=r) for r in range(dp)]
    assert run(ranks, 100) == reference
    for L in ranks:
        L.close()


@pytest.mark.parametrize("dp, resume_dp", [(2, 8), (4, 1), (8, 2)])
def test_resume_inside_the_ramp_at_another_dp(data_dirs, reference, dp, resume_dp):
    ranks = [make(data_dirs, Schedule(spec_three_phases()), dp=dp, rank=r) for r in range(dp)]
    head = run(ranks, 57)  # step 57: inside the ramp (40-79)
    state = merge_states([L.checkpoint() for L in ranks])
    for L in ranks:
        L.close()
    assert state["step"] == 57 and len(json.dumps(state)) < 64 * 1024
    resumed = [make(data_dirs, Schedule(spec_three_phases()), dp=resume_dp, rank=r) for r in range(resume_dp)]
    for L in resumed:
        L.restore(state)
    tail = run(resumed, 43)
    assert {**head, **tail} == reference
    for L in resumed:
        L.close()


def test_checkpoint_at_64_lanes_stays_under_64_kib(data_dirs):
    L = make(data_dirs, Schedule(spec_three_phases()), lanes=64, gbs=128, chunk_size=8)
    run([L], 30)
    size = len(json.dumps(L.checkpoint()))
    L.close()
    assert size <= 64 * 1024, size


# ---------------------------------------------------------------- append a phase on resume


def extended(spec, at, weights):
    """``spec`` with a step change to ``weights`` from step ``at`` appended to every dataset."""
    out = []
    for s, w in zip(spec, weights):
        (kind, pts), = s.items()
        out.append({kind: {**pts, at - 1: schedule_weight(s, at - 1), at: w}} if kind == "linear" else
                   {kind: {**pts, at: w}})
    return out


def test_a_phase_appended_after_the_checkpoint_restores_and_matches_a_run_of_the_new_schedule(data_dirs):
    new = extended(spec_three_phases(), 200, [0, 1, 1])
    assert Schedule(spec_three_phases()).first_difference(Schedule(new)) == 200
    old = [make(data_dirs, Schedule(spec_three_phases()), dp=2, rank=r) for r in range(2)]
    run(old, 130)
    state = merge_states([L.checkpoint() for L in old])
    for L in old:
        L.close()
    ref = make(data_dirs, Schedule(new))
    expected = run([ref], 230)
    ref.close()
    resumed = [make(data_dirs, Schedule(new), dp=4, rank=r) for r in range(4)]
    for L in resumed:
        L.restore(state)
    tail = run(resumed, 100)
    assert tail == {s: expected[s] for s in range(130, 230)}
    assert sum(r[0] == 0 for s in range(200, 230) for lane in tail[s].values() for r in lane) == 0  # web left
    for L in resumed:
        L.close()


def test_a_schedule_that_changes_the_past_is_refused_naming_the_step(data_dirs):
    L = make(data_dirs, Schedule(spec_three_phases()))
    run([L], 60)
    state = L.checkpoint()
    L.close()
    past = [{"linear": {0: 3, 30: 3, 80: 1}}, *spec_three_phases()[1:]]  # the ramp starts at 30, not 40
    with pytest.raises(CheckpointError, match=r"differs from the checkpoint's from step 31"):
        make(data_dirs, Schedule(past)).restore(state)
    # a change right at the checkpoint step is too early as well: the span in progress was drawn under the old one
    soon = extended(spec_three_phases(), 61, [1, 1, 1])
    with pytest.raises(CheckpointError, match=r"from step 61 .*start the new phase at step (\d+) or later"):
        make(data_dirs, Schedule(soon)).restore(state)
    # plain weights and a schedule never mix
    with pytest.raises(CheckpointError, match="another config"):
        make(data_dirs, [1, 1, 1]).restore(state)


def test_the_schedule_is_part_of_the_work_source_config():
    class DS:
        def __init__(self, name, n):
            self.name, self.shard_sizes = name, [n]

        def fingerprint(self):
            return {"name": self.name}

    ds = [DS("a", 10), DS("b", 10)]
    a = WorkSource(ds, Schedule([1, {"step": {0: 1, 5: 0}}]), canonical_replicas=2, chunk_size=4, step_size=4)
    b = WorkSource(ds, Schedule([1, {"step": {0: 1, 6: 0}}]), canonical_replicas=2, chunk_size=4, step_size=4)
    assert a.fingerprint()["schedule"] != b.fingerprint()["schedule"]
    with pytest.raises(ValueError, match="exhaustion='repeat'"):
        WorkSource(ds, Schedule([1, 1]), canonical_replicas=2, step_size=4, exhaustion="stop")
    with pytest.raises(ValueError, match="multiple of canonical_replicas"):
        WorkSource(ds, Schedule([1, 1]), canonical_replicas=4, step_size=6)
    with pytest.raises(ValueError, match="a schedule of 3 datasets for 2"):
        WorkSource(ds, Schedule([1, 1, 1]), canonical_replicas=2, step_size=4)


def test_scheduled_allocation_is_pinned():
    """Pinned output of the scheduled allocation (like tests/test_golden.py for the static one): a change
    here changes every scheduled stream, so checkpoints of the old one must be refused (ALGORITHM_VERSION)."""
    mix = ScheduledMixture(Schedule([{"linear": {0: 3, 4: 3, 8: 1}}, {"linear": {0: 1, 4: 1, 8: 2}},
                                     {"step": {0: 0, 6: 1}}]), 4)
    ds, _ = mix.assign(np.arange(48))
    assert "".join(map(str, ds.tolist())) == "100010001000100010001020012010120112011201120112"


class TwoShards:
    """What WorkSource needs from a dataset (picklable: module level)."""

    def __init__(self, name, n):
        self.name, self.shard_sizes = name, [n, n + 3]

    def fingerprint(self):
        return {"name": self.name}


def test_a_scheduled_source_pickles_to_the_same_streams():
    import pickle

    src = WorkSource([TwoShards("a", 50), TwoShards("b", 30)], Schedule([{"linear": {0: 1, 10: 0}}, 1]),
                     canonical_replicas=4, chunk_size=8, step_size=8)
    before = [src.chunk(lane, 3) for lane in range(4)]
    again = pickle.loads(pickle.dumps(src))
    for a, b in zip(before, [again.chunk(lane, 3) for lane in range(4)]):
        assert a.dataset_ids.tolist() == b.dataset_ids.tolist() and a.sample_idx.tolist() == b.sample_idx.tolist()
