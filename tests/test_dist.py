"""Checkpoint aggregation across real ranks.

torch.distributed: one ``torch.multiprocessing`` spawn per world size (1, 2, 4) over gloo, each rank building
its own Loader; the spawn runs every scenario in order (gathers, a refused merge, then a rank that exits) so
torch is imported once per child. Shared directory: plain ``multiprocessing`` processes, no torch.
Oracles are computed here, in the test process: per-rank states from loaders built independently of the
children, global-batch digests of an uninterrupted dp=1 run (``StepHasher``, independent of the engine).
"""
from __future__ import annotations

import json
import multiprocessing
import os
import subprocess
import sys
import threading
import time
import traceback

import pytest

from zephon.checkpoint import (AggregationError, DirectoryAggregator, committed_rounds, gather_checkpoint,
                         latest_checkpoint)
from zephon.checkpoint import CheckpointError, merge_states

from helpers import StepHasher, make_loader, run_steps

STEPS1, STEPS2 = 3, 2        # steps before the first and the second gather
FAULT_TIMEOUT = 4.0          # seconds, aggregators of the fault rounds
SLACK = 15.0                 # seconds on top of the timeout: 2 shared cores, spawned interpreters
OK_TIMEOUT = 60.0            # aggregators that must not time out (ranks start seconds apart)
JOIN_LIMIT = 240.0           # a hung spawn fails the test instead of hanging the suite
# A rank built for twice the dp degree (the last rank of the doubled job) leaves these lanes of 8
# uncovered (contiguous lane blocks, worked out by hand).
MISSING_LANES = {1: "0-3", 2: "4-5", 4: "6"}


def _loader(paths, dp, rank):
    return make_loader([paths["docs"]], paths["tok"], dp=dp, rank=rank)


def _json(obj):
    """As a checkpoint reads back from JSON (what every transport returns)."""
    return json.loads(json.dumps(obj))


def _rank_states(paths, dp, steps):
    """Each rank's checkpoint after ``steps`` steps, from loaders built here (not in the children)."""
    out = []
    for r in range(dp):
        L = _loader(paths, dp, r)
        run_steps([L], steps, StepHasher())
        out.append(L.checkpoint())
        L.close()
    return out


def _assert_restores(paths, state, dp, reference):
    """Restoring ``state`` on ``dp`` ranks gives the reference digests of the next two global steps."""
    loaders = [_loader(paths, dp, r) for r in range(dp)]
    for L in loaders:
        L.restore(state)
    h = StepHasher()
    run_steps(loaders, 2, h)
    step = state["step"]
    assert h.digests() == {s: reference[s] for s in (step, step + 1)}


def _dump(out_dir, rank, res):
    with open(os.path.join(out_dir, f"rank-{rank}.json"), "w") as fh:
        json.dump(res, fh)


def _results(out_dir, world):
    res = []
    for r in range(world):
        with open(os.path.join(out_dir, f"rank-{r}.json")) as fh:
            res.append(json.load(fh))
    for r, x in enumerate(res):
        assert "error" not in x, f"rank {r} failed:\n{x['error']}"
    return res


@pytest.fixture(scope="module")
def paths(corpus, tokenizer_path):
    return {"docs": corpus["docs_jsonl"], "tok": tokenizer_path}


@pytest.fixture(scope="module")
def reference(paths):
    """Digests of global steps 0..STEPS1+STEPS2+1 of one uninterrupted dp=1 run."""
    L = _loader(paths, 1, 0)
    h = StepHasher()
    run_steps([L], STEPS1 + STEPS2 + 2, h)
    return h.digests()


# ---------------------------------------------------------------------------------------------------
# torch.distributed (gloo), real processes
# ---------------------------------------------------------------------------------------------------
TORCH_VICTIM = {2: 0, 4: 2}  # world size -> the rank that exits instead of joining the fault round
TORCH_HUNG = 3               # world 4: this rank stays alive but skips one round (a stuck rank)


def _torch_child(rank, world, store_file, paths, out_dir):
    """One rank of a spawned gloo job: gather twice, a refused merge, (world 4) a rank that hangs, then
    (world > 1) a rank that exits."""
    res = {}
    try:
        import torch.distributed as dist

        from zephon.checkpoint import TorchDistAggregator

        dist.init_process_group("gloo", init_method=f"file://{store_file}", rank=rank, world_size=world)
        ok = TorchDistAggregator(timeout=OK_TIMEOUT, run_id="torch-ok")
        fault = TorchDistAggregator(timeout=FAULT_TIMEOUT, run_id="torch-fault")
        hung = TorchDistAggregator(timeout=FAULT_TIMEOUT, run_id="torch-hung") if world == 4 else None
        L = _loader(paths, world, rank)
        run_steps([L], STEPS1, StepHasher())
        res["state1"] = L.checkpoint()
        res["global1"] = ok.gather(rank, res["state1"])
        run_steps([L], STEPS2, StepHasher())
        res["state2"] = L.checkpoint()
        res["global2"] = gather_checkpoint(res["state2"], timeout=OK_TIMEOUT)  # picks torch.distributed
        # (b) the last rank was built for twice the dp degree: its lanes do not cover its share
        bad = res["state2"] if rank < world - 1 else _loader(paths, 2 * world, 2 * world - 1).checkpoint()
        try:
            ok.gather(rank, bad)
            res["bad"] = None
        except CheckpointError as e:
            res["bad"] = [type(e).__name__, str(e)]
        if hung is not None:  # a live rank that does not call gather: the barrier's timeout fires
            ok.gather(rank, res["state2"])
            t0 = time.monotonic()
            if rank == TORCH_HUNG:
                time.sleep(FAULT_TIMEOUT + 1)
            else:
                try:
                    hung.gather(rank, res["state2"])
                    res["hung"] = None
                except AggregationError as e:
                    res["hung"] = {"message": str(e), "missing": e.missing_ranks, "elapsed": time.monotonic() - t0}
        if world == 4:  # a live rank that never builds its aggregator (as at a job's first checkpoint)
            ok.gather(rank, res["state2"])
            t0 = time.monotonic()
            if rank == TORCH_HUNG:
                time.sleep(FAULT_TIMEOUT + 1)
            else:
                try:
                    TorchDistAggregator(timeout=FAULT_TIMEOUT, run_id="torch-absent")
                    res["absent"] = None
                except AggregationError as e:
                    res["absent"] = {"message": str(e), "missing": e.missing_ranks,
                                     "elapsed": time.monotonic() - t0}
        if world > 1:  # (a) a rank exits instead of joining
            ok.gather(rank, res["state2"])  # lines the ranks up right before the fault round
            if rank == TORCH_VICTIM[world]:
                _dump(out_dir, rank, res)
                os._exit(0)
            t0 = time.monotonic()
            try:
                fault.gather(rank, res["state2"])
                res["fault"] = None
            except AggregationError as e:
                res["fault"] = {"message": str(e), "missing": e.missing_ranks, "timeout": e.timeout, "run": e.run,
                                "elapsed": time.monotonic() - t0}
    except BaseException:  # noqa: BLE001 - reported to the test process
        res["error"] = traceback.format_exc()
    _dump(out_dir, rank, res)
    os._exit(0)  # skip interpreter teardown: a process group with a dead peer may block in it


@pytest.fixture(scope="module")
def torch_run(paths, tmp_path_factory):
    """world size -> per-rank result dicts of one spawned gloo job (cached: one spawn per world size)."""
    cache = {}

    def run(world):
        if world in cache:
            return cache[world]
        import torch.multiprocessing as tmp

        d = tmp_path_factory.mktemp(f"torch{world}")
        ctx = tmp.spawn(_torch_child, args=(world, str(d / "store"), paths, str(d)), nprocs=world, join=False)
        deadline = time.monotonic() + JOIN_LIMIT
        while not ctx.join(timeout=1):
            if time.monotonic() > deadline:
                for p in ctx.processes:
                    if p.is_alive():
                        p.kill()
                pytest.fail(f"the world-size-{world} gloo job did not finish in {JOIN_LIMIT} s")
        cache[world] = _results(str(d), world)
        return cache[world]

    return run


@pytest.mark.contract("torch.distributed")
@pytest.mark.parametrize("world", [1, 2, 4])
def test_torch_gather_returns_the_merge_of_independently_computed_rank_states(world, torch_run, paths):
    res = torch_run(world)
    for key, steps in (("1", STEPS1), ("2", STEPS1 + STEPS2)):
        expected_ranks = _rank_states(paths, world, steps)
        assert [x["state" + key] for x in res] == _json(expected_ranks)  # ranks are deterministic
        expected = _json(merge_states(expected_ranks))
        assert [x["global" + key] for x in res] == [expected] * world  # every rank, the same dict
        assert [e["lane"] for e in expected["lanes"]] == list(range(8)) and expected["step"] == steps


@pytest.mark.contract("torch.distributed")
@pytest.mark.parametrize("world,dp", [(1, 2), (2, 4), (4, 1)])
def test_torch_gathered_state_restores_at_another_dp_degree(world, dp, torch_run, paths, reference):
    _assert_restores(paths, torch_run(world)[0]["global2"], dp, reference)


@pytest.mark.contract("torch.faults")
@pytest.mark.parametrize("world", [1, 2, 4])
def test_torch_merge_with_a_missing_lane_is_refused_on_every_rank(world, torch_run):
    for x in torch_run(world):
        kind, message = x["bad"]
        assert kind == "CheckpointError"  # the states arrived; their merge is what is refused
        assert f"lacks lanes {MISSING_LANES[world]} of 8" in message


def _failures_naming(torch_run, world, missing, key, tag):
    """The failure each surviving rank of a ``world``-rank run recorded under ``key``, each checked to name
    the ``missing`` rank and the run ``tag``."""
    survivors = [x for r, x in enumerate(torch_run(world)) if r != missing]
    assert len(survivors) == world - 1
    for x in survivors:
        f = x[key]
        assert f is not None, f"the {key} round did not fail"
        assert f["missing"] == [missing] and f"ranks [{missing}]" in f["message"] and tag in f["message"]
    return [x[key] for x in survivors]


@pytest.mark.contract("torch.faults")
@pytest.mark.parametrize("world", [2, 4])
def test_torch_rank_that_exits_is_named_by_the_others_within_the_timeout(world, torch_run):
    for f in _failures_naming(torch_run, world, TORCH_VICTIM[world], "fault", "torch-fault"):
        assert f"timeout {FAULT_TIMEOUT:g} s" in f["message"]
        assert (f["timeout"], f["run"]) == (FAULT_TIMEOUT, "torch-fault")
        assert f["elapsed"] <= FAULT_TIMEOUT + SLACK


@pytest.mark.contract("torch.faults")
def test_torch_rank_that_hangs_is_named_by_the_others_after_the_timeout(torch_run):
    for f in _failures_naming(torch_run, 4, TORCH_HUNG, "hung", "torch-hung"):
        assert FAULT_TIMEOUT * 0.9 <= f["elapsed"] <= FAULT_TIMEOUT + SLACK  # waited the timeout, no longer


@pytest.mark.contract("torch.faults")
def test_torch_rank_absent_when_the_aggregator_is_built_is_named(torch_run):
    for f in _failures_naming(torch_run, 4, TORCH_HUNG, "absent", "torch-absent"):
        assert f["elapsed"] <= FAULT_TIMEOUT + SLACK


# ---------------------------------------------------------------------------------------------------
# Shared directory, real processes (no torch)
# ---------------------------------------------------------------------------------------------------
RUN = "run-a"


def _dir_child(rank, world, agg_dir, paths, out_dir, scenario):
    """One rank of a directory-aggregated job. Round 1 commits; then ``scenario``:
    "dead_peer": rank 2 exits before round 2; "dead_rank0": a refused merge (tag "bad-lanes"), then rank 0
    exits after every state file exists but before its commit."""
    res = {}
    try:
        L = _loader(paths, world, rank)
        run_steps([L], STEPS1, StepHasher())
        res["state1"] = L.checkpoint()
        res["global1"] = gather_checkpoint(res["state1"], aggregate_dir=agg_dir, run_id=RUN, world_size=world,
                                           rank=rank, timeout=OK_TIMEOUT)
        run_steps([L], STEPS2, StepHasher())
        state2 = L.checkpoint()
        if scenario == "dead_rank0":
            bad = state2 if rank == 0 else _loader(paths, 2 * world, 2 * world - 1).checkpoint()
            try:
                DirectoryAggregator(agg_dir, RUN, world, timeout=OK_TIMEOUT).gather(rank, bad, tag="bad-lanes")
                res["bad"] = None
            except CheckpointError as e:
                res["bad"] = [type(e).__name__, str(e)]
        fault = DirectoryAggregator(agg_dir, RUN, world, timeout=FAULT_TIMEOUT)
        if scenario == "dead_peer" and rank == 2:
            _dump(out_dir, rank, res)
            os._exit(0)
        if scenario == "dead_rank0" and rank == 0:
            _dump(out_dir, rank, res)
            fault._merge_and_commit = lambda *a: os._exit(0)  # dies with every state file on disk
        t0 = time.monotonic()
        try:
            fault.gather(rank, state2)
            res["fault"] = None
        except AggregationError as e:
            res["fault"] = {"message": str(e), "missing": e.missing_ranks, "elapsed": time.monotonic() - t0}
    except BaseException:  # noqa: BLE001 - reported to the test process
        res["error"] = traceback.format_exc()
    _dump(out_dir, rank, res)
    os._exit(0)


@pytest.fixture(scope="module")
def dir_run(paths, tmp_path_factory):
    """scenario -> (aggregate dir, world size, per-rank results); one set of processes per scenario."""
    cache = {}

    def run(scenario, world):
        if scenario in cache:
            return cache[scenario]
        d = tmp_path_factory.mktemp(scenario)
        agg_dir = str(d / "agg")
        ctx = multiprocessing.get_context("spawn")  # fork would copy the test process's threads
        procs = [ctx.Process(target=_dir_child, args=(r, world, agg_dir, paths, str(d), scenario))
                 for r in range(world)]
        for p in procs:
            p.start()
        for p in procs:
            p.join(JOIN_LIMIT)
        for p in procs:
            if p.is_alive():
                p.kill()
                pytest.fail(f"directory scenario {scenario}: a rank did not finish in {JOIN_LIMIT} s")
        cache[scenario] = (agg_dir, world, _results(str(d), world))
        return cache[scenario]

    return run


@pytest.mark.parametrize("scenario,world", [("dead_peer", 4), ("dead_rank0", 2)])
def test_directory_gather_returns_the_merge_of_independently_computed_rank_states(scenario, world, dir_run,
                                                                                      paths):
    agg_dir, world, res = dir_run(scenario, world)
    expected_ranks = _rank_states(paths, world, STEPS1)
    assert [x["state1"] for x in res] == _json(expected_ranks)
    expected = _json(merge_states(expected_ranks))
    assert [x["global1"] for x in res] == [expected] * world
    with open(os.path.join(agg_dir, RUN, "round-00000001", "global.json")) as fh:
        assert json.load(fh) == expected


@pytest.mark.parametrize("scenario,world,victim", [("dead_peer", 4, 2), ("dead_rank0", 2, 0)])
def test_directory_dead_rank_is_named_and_the_last_committed_round_still_restores(scenario, world, victim,
                                                                                   dir_run, paths, reference):
    agg_dir, world, res = dir_run(scenario, world)
    round2 = os.path.join(agg_dir, RUN, "round-00000002")
    for r, x in enumerate(res):
        if r == victim:
            continue
        f = x["fault"]
        assert f is not None, "the fault round did not fail"
        assert f["missing"] == [victim]
        if victim == 0:  # every state file is there: rank 0 is named as the one that did not commit
            assert "rank 0 did not commit" in f["message"]
        else:
            assert f"ranks [{victim}] did not write their state" in f["message"]
        assert round2 in f["message"] and RUN in f["message"] and f"{FAULT_TIMEOUT:g} s" in f["message"]
        assert f["elapsed"] <= FAULT_TIMEOUT + SLACK
    # the failed round never committed; the previous one is still the latest and restores
    assert not os.path.exists(os.path.join(round2, "COMMITTED"))
    assert os.path.exists(os.path.join(round2, f"rank-{victim}.json")) == (victim == 0)
    assert committed_rounds(agg_dir, RUN) == ["round-00000001"]
    latest = latest_checkpoint(agg_dir, RUN)
    assert latest == res[0]["global1"] == _json(merge_states(_rank_states(paths, world, STEPS1)))
    _assert_restores(paths, latest, {4: 2, 2: 1}[world], reference)


def test_directory_merge_with_a_missing_lane_is_refused_on_every_rank(dir_run):
    agg_dir, world, res = dir_run("dead_rank0", 2)
    for x in res:
        kind, message = x["bad"]
        assert kind == "CheckpointError" and f"lacks lanes {MISSING_LANES[world]} of 8" in message
        assert "bad-lanes" in message  # names the round directory
    assert os.path.exists(os.path.join(agg_dir, RUN, "bad-lanes", "FAILED"))
    assert "bad-lanes" not in committed_rounds(agg_dir, RUN)


# ---------------------------------------------------------------------------------------------------
# Shared directory, ranks as threads (protocol details; fast)
# ---------------------------------------------------------------------------------------------------
def _gather_all(aggs, states, tag=None, first_delay=0.0, first=0):
    """Rank r = aggs[r] gathers states[r] in its own thread; rank ``first`` starts ``first_delay`` s ahead."""
    out, errs = [None] * len(aggs), []

    def go(r):
        try:
            out[r] = aggs[r].gather(r, states[r], tag=tag)
        except Exception as e:  # noqa: BLE001
            errs.append(e)

    threads = [threading.Thread(target=go, args=(r,)) for r in range(len(aggs))]
    threads[first].start()
    time.sleep(first_delay)
    for r, t in enumerate(threads):
        if r != first:
            t.start()
    for t in threads:
        t.join(60)
    assert not errs, errs
    return out


@pytest.fixture(scope="module")
def dp2_states(paths):
    """dp=2 rank states after 1, 2 and 3 steps."""
    return {s: _rank_states(paths, 2, s) for s in (1, 2, 3)}


def test_directory_rounds_order_by_commit_and_a_restart_counts_on(tmp_path, dp2_states):
    aggs = [DirectoryAggregator(tmp_path, "r", 2, timeout=30) for _ in range(2)]
    assert latest_checkpoint(tmp_path, "r") is None
    g1 = _gather_all(aggs, dp2_states[1])
    g2 = _gather_all(aggs, dp2_states[2], tag="a-eval")  # sorts before "round-..." by name, committed later
    assert g1 == [_json(merge_states(dp2_states[1]))] * 2 and g2 == [_json(merge_states(dp2_states[2]))] * 2
    assert committed_rounds(tmp_path, "r") == ["round-00000001", "a-eval"]
    assert latest_checkpoint(tmp_path, "r") == g2[0]
    restarted = [DirectoryAggregator(tmp_path, "r", 2, timeout=30) for _ in range(2)]
    _gather_all(restarted, dp2_states[3])
    assert committed_rounds(tmp_path, "r")[-1] == "round-00000002"
    assert latest_checkpoint(tmp_path, "r")["step"] == 3


def test_directory_restart_never_merges_leftovers_of_an_uncommitted_round(tmp_path, dp2_states):
    _gather_all([DirectoryAggregator(tmp_path, "r", 2, timeout=30) for _ in range(2)], dp2_states[1])
    # an earlier incarnation's rank 1 wrote round 2 (its step-2 state), rank 0 never came
    with pytest.raises(AggregationError, match=r"ranks \[0\] did not write") as ei:
        DirectoryAggregator(tmp_path, "r", 2, timeout=0.3).gather(1, dp2_states[2][1])
    assert ei.value.missing_ranks == [0] and ei.value.run == "r"
    assert latest_checkpoint(tmp_path, "r")["step"] == 1
    # the restarted job reaches round 2 at step 3; rank 0 comes first and must not merge the leftover
    out = _gather_all([DirectoryAggregator(tmp_path, "r", 2, timeout=30) for _ in range(2)], dp2_states[3],
                      first_delay=0.5)
    assert out == [_json(merge_states(dp2_states[3]))] * 2
    assert committed_rounds(tmp_path, "r") == ["round-00000001", "round-00000002"]


def test_directory_reused_tag_is_aggregated_again_and_never_answered_by_its_older_commit(tmp_path, dp2_states):
    aggs = [DirectoryAggregator(tmp_path, "r", 2, timeout=30) for _ in range(2)]
    _gather_all(aggs, dp2_states[1], tag="t")
    # rank 1 comes first and finds round "t" committed (step 1): not its state, so it waits for rank 0
    out = _gather_all(aggs, dp2_states[2], tag="t", first=1, first_delay=0.5)
    assert out == [_json(merge_states(dp2_states[2]))] * 2
    assert latest_checkpoint(tmp_path, "r")["step"] == 2


def test_directory_latest_checkpoint_refuses_a_global_state_changed_after_commit(tmp_path, dp2_states):
    _gather_all([DirectoryAggregator(tmp_path, "r", 2, timeout=30) for _ in range(2)], dp2_states[1])
    path = tmp_path / "r" / "round-00000001" / "global.json"
    path.write_text(path.read_text().replace('"step":1', '"step":9'))
    with pytest.raises(CheckpointError, match="does not match the digest"):
        latest_checkpoint(tmp_path, "r")


def test_directory_rank_outside_the_world_is_refused(tmp_path, dp2_states):
    with pytest.raises(CheckpointError, match=r"rank 2 outside \[0, 2\)"):
        DirectoryAggregator(tmp_path, "r", 2, timeout=1).gather(2, dp2_states[1][0])
    assert not (tmp_path / "r").exists()  # nothing written


# ---------------------------------------------------------------------------------------------------
# gather_checkpoint without a transport, and the core without torch
# ---------------------------------------------------------------------------------------------------
def test_gather_checkpoint_in_one_process_merges_or_names_missing_lanes(paths):
    whole = _loader(paths, 1, 0).checkpoint()
    assert gather_checkpoint(whole) == merge_states([whole])
    half = _loader(paths, 2, 0).checkpoint()
    with pytest.raises(CheckpointError, match="lacks lanes 4-7 of 8"):
        gather_checkpoint(half)
    with pytest.raises(ValueError, match="world_size=2"):
        gather_checkpoint(half, world_size=2)


def test_the_core_and_zephon_checkpoint_import_without_torch():
    code = ("import sys; sys.modules['torch'] = None\n"  # any `import torch` now raises ImportError
            "import zephon, zephon.checkpoint, zephon.engine\n"
            "from zephon.checkpoint import gather_checkpoint, DirectoryAggregator, TorchDistAggregator\n"
            "print('ok')")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr
