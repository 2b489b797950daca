"""dp_degree a multiple of canonical_replicas: ranks share a lane and take their block of its steps.

Oracles: an uninterrupted dp 1 run hashed by the test-side ``StepHasher`` (rows per lane in delivery order);
which rows a sharing rank owes is computed here from the step arithmetic, not by the code under test.
"""
from __future__ import annotations

import json

import pytest

from helpers import StepHasher, make_loader
from zephon import merge_states
from zephon.checkpoint import CheckpointError
from zephon.work import TopologyError, check_share_rows, lane_share, lanes_for_rank

R = 64          # lanes
GBS = 128       # 2 rows per lane per step: 2 ranks per lane take 1 row each
STEPS = 6


def _dirs(corpus):
    return [corpus["docs_jsonl"], corpus["code_jsonl"]]


def _ranks(corpus, tok, dp, **kw):
    kw = dict(dict(weights=[0.7, 0.3], canonical_replicas=R, global_batch_size=GBS, chunk_size=8,
                   flush_every_k_chunks=1, max_length=64), **kw)
    return [make_loader(_dirs(corpus), tok, dp=dp, rank=r, **kw) for r in range(dp)]


def _owed(L, state_lanes, end_step):
    """Micro-batches rank ``L`` yields before step ``end_step`` from a start where lane ``l`` has delivered
    ``state_lanes[l]`` rows: its micro-batches j of each step (its block when it shares the lane) whose rows
    are not all delivered yet. Computed from the definition, independently of the Loader's filter."""
    m, rps = L.batch.micro_batch_size, L.global_batch_size // L.canonical_replicas
    shares = max(1, L.dp_degree // L.canonical_replicas)
    k = L.dp_rank % shares  # contiguous assignment
    per = rps // shares
    n = 0
    for lane in L.lanes:
        d = state_lanes.get(lane, 0)
        for s in range(end_step):
            for j in range(k * per // m, (k + 1) * per // m):
                n += s * rps + (j + 1) * m > d
    return n


def _run(loaders, end_step, hasher, start=None):
    """Pull from each rank, in rank order, every micro-batch it owes before ``end_step``; returns the iterators'
    last micro-batches' steps (to check nothing later was pulled)."""
    lanes = {e["lane"]: e["delivered_rows"] for e in (start or {"lanes": []})["lanes"]}
    for L in loaders:
        it = iter(L)
        for _ in range(_owed(L, lanes, end_step)):
            mb = next(it)
            assert mb["__step__"] < end_step
            hasher.add(mb)


def _close(loaders):
    for L in loaders:
        L.close()


@pytest.fixture(scope="module")
def reference(corpus, tokenizer_path):
    h = StepHasher()
    (L,) = _ranks(corpus, tokenizer_path, 1)
    _run([L], STEPS, h)
    L.close()
    d = h.digests()
    assert len(d) == STEPS
    return d


def test_lane_share_arithmetic():
    """Every (lane, block) pair is taken by exactly one rank, for both assignments."""
    for assignment in ("contiguous", "interleaved"):
        for R_, dp in ((8, 16), (8, 24), (1, 3), (64, 128)):
            seen = set()
            for r in range(dp):
                (lane,), (shares, k) = lanes_for_rank(R_, dp, r, assignment), lane_share(R_, dp, r, assignment)
                assert shares == dp // R_
                seen.add((lane, k))
            assert seen == {(lane, k) for lane in range(R_) for k in range(dp // R_)}
    assert lane_share(8, 4, 3) == (1, 0)
    assert lanes_for_rank(8, 16, 5) == [2] and lane_share(8, 16, 5) == (2, 1)
    assert lanes_for_rank(8, 16, 5, "interleaved") == [5] and lane_share(8, 16, 13, "interleaved") == (2, 1)


@pytest.mark.parametrize("dp, assignment", [(16, "contiguous"), (128, "contiguous"), (128, "interleaved")])
def test_global_batches_identical_to_dp1(corpus, tokenizer_path, reference, dp, assignment):
    h = StepHasher()
    ranks = _ranks(corpus, tokenizer_path, dp, lane_assignment=assignment)
    if assignment == "contiguous":
        _run(ranks, STEPS, h)
    else:  # ranks l and l + 64 share lane l: hash in (block) order, rank l first
        for L in ranks:
            it = iter(L)
            for _ in range(STEPS):
                h.add(next(it))
    _close(ranks)
    got = h.digests()
    assert [s for s in range(STEPS) if got[s] != reference[s]] == []


@pytest.mark.slow  # covered: the verify test at dp 128 -> 32 below and the mid-step 64 -> 128 restore
def test_resume_64_128_32_identical(corpus, tokenizer_path, reference):
    """Checkpoint at step 2 on 64 ranks, resume on 128 (sharing lanes), checkpoint at step 4, resume on 32."""
    h = StepHasher()
    state = None
    for dp, end in ((64, 2), (128, 4), (32, STEPS)):
        ranks = _ranks(corpus, tokenizer_path, dp)
        for L in ranks:
            if state is not None:
                L.restore(state)
        _run(ranks, end, h, start=state)
        rank_states = [L.checkpoint() for L in ranks]
        _close(ranks)
        if dp == 128:  # both ranks of a lane hand in the same entry
            assert all(rank_states[2 * i]["lanes"] == rank_states[2 * i + 1]["lanes"] for i in range(R))
        state = json.loads(json.dumps(merge_states(rank_states)))
        assert state["step"] == end
    got = h.digests()
    assert [s for s in range(STEPS) if got[s] != reference[s]] == []


def test_mid_step_checkpoint_restores_onto_sharing_ranks(corpus, tokenizer_path, reference):
    """A dp 64 checkpoint taken inside a step (1 of a lane's 2 rows delivered) restores on 128 ranks: the rank
    whose block was delivered yields nothing of that step, the other its row; then both go on."""
    h = StepHasher()
    ranks = _ranks(corpus, tokenizer_path, 64)
    _run(ranks, 2, h)
    for L in ranks:  # half of step 2 (micro-batch 0 of every lane)
        it = iter(L)
        mb = next(it)
        assert (mb["__step__"], mb["__micro__"]) == (2, 0)
        h.add(mb)
    state = json.loads(json.dumps(merge_states([L.checkpoint() for L in ranks])))
    _close(ranks)
    shared = _ranks(corpus, tokenizer_path, 128)
    for L in shared:
        L.restore(state)
    _run(shared, STEPS, h, start=state)
    _close(shared)
    got = h.digests()
    assert [s for s in range(STEPS) if got[s] != reference[s]] == []


def test_sharing_state_is_a_step_boundary_whatever_the_runner(corpus, tokenizer_path):
    """The entry a sharing rank checkpoints after a step (and emits with its last micro-batch) is the same with
    and without prefetching workers, and for both ranks of the lane: merge_states needs them identical."""
    kw = dict(canonical_replicas=8, global_batch_size=64, micro_batch=2, chunk_size=8, flush_every_k_chunks=1,
              max_length=64)  # 8 rows per lane step: micro-batches 0-1 for rank 0 of the lane, 2-3 for rank 1
    entries = []
    for rank, runner in ((0, "inline"), (1, "threads"), (1, "inline"), (0, "threads")):
        L = make_loader([corpus["docs_jsonl"]], tokenizer_path, dp=16, rank=rank, runner=runner, **kw)
        L.emit_state = True
        it, per_step = iter(L), []
        for step in range(5):
            mbs = [next(it), next(it)]
            assert [(mb["__step__"], mb["__micro__"]) for mb in mbs] == [(step, 2 * rank), (step, 2 * rank + 1)]
            assert mbs[-1]["__state__"] == L.checkpoint()["lanes"][0]
            per_step.append(L.checkpoint()["lanes"])
        L.close()
        entries.append(per_step)
    assert entries[0] == entries[1] == entries[2] == entries[3]
    assert [e[0]["delivered_rows"] for e in entries[0]] == [8, 16, 24, 32, 40]


def test_merge_refuses_sharing_ranks_at_different_points(corpus, tokenizer_path):
    kw = dict(canonical_replicas=8, global_batch_size=32, micro_batch=2, chunk_size=8, flush_every_k_chunks=1,
              max_length=64)
    a, b = (make_loader([corpus["docs_jsonl"]], tokenizer_path, dp=16, rank=r, **kw) for r in (6, 7))
    ia, ib = iter(a), iter(b)
    for _ in range(2):
        next(ia)
    for _ in range(4):
        next(ib)
    with pytest.raises(CheckpointError) as ei:
        merge_states([a.checkpoint(), b.checkpoint()], complete=False)
    msg = str(ei.value)
    assert "lane 3 is in rank states 0 and 1" in msg
    assert "8 rows delivered (step 2)" in msg and "16 rows delivered (step 4)" in msg
    assert "step boundary" in msg
    a.close()
    b.close()
    # the same point: accepted, one entry for the lane
    c = make_loader([corpus["docs_jsonl"]], tokenizer_path, dp=16, rank=6, **kw)
    ic = iter(c)
    for _ in range(4):
        next(ic)
    merged = merge_states([c.checkpoint(), b.checkpoint()], complete=False)
    assert [e["lane"] for e in merged["lanes"]] == [3]
    c.close()


def test_refusals(corpus, tokenizer_path):
    with pytest.raises(TopologyError, match=r"dp_degree=96 does not divide canonical_replicas=64 and is not a "
                                            r"multiple of it; valid dp degrees are \[1, 2, 4, 8, 16, 32, 64\] or a "
                                            r"multiple of 64"):
        lanes_for_rank(64, 96, 0)
    # 2 rows per lane step, 2 ranks per lane, micro-batches of 2: no equal blocks of whole micro-batches
    with pytest.raises(TopologyError, match=r"2 ranks share each lane, but the 2 rows a lane gives per step .* "
                                            r"not a multiple of 2 x micro_batch_size=2 = 4"):
        make_loader([corpus["docs_jsonl"]], tokenizer_path, dp=16, rank=0, canonical_replicas=8,
                    global_batch_size=16, micro_batch=2)
    with pytest.raises(TopologyError, match="3 ranks share each lane, but the 4 rows"):
        check_share_rows(4, 1, 3)
    assert check_share_rows(12, 2, 3) == 4


def test_finite_pass_with_padding_matches_dp1_and_dp8(corpus, tokenizer_path):
    """A finite pass (exhaustion='stop', drop_last=False: padded tail) at dp 16 on 8 lanes delivers the rows of
    dp 1 step by step, and exactly what dp 8 (one lane per rank, each padding its own lane's last step) delivers,
    padding included. (Padding every rank to the last step of all is ``host.RankSession``'s job, not the core's.)"""
    kw = dict(canonical_replicas=8, global_batch_size=16, chunk_size=8, flush_every_k_chunks=1, max_length=64,
              exhaustion="stop", drop_last=False)

    def run(dp):
        real, every, n_pad = StepHasher(), StepHasher(), 0
        for r in range(dp):
            L = make_loader([corpus["code_jsonl"]], tokenizer_path, dp=dp, rank=r, **kw)
            for mb in L:  # micro-batches of 1 row: padding or not
                every.add(mb)
                if mb.get("__pad__"):
                    n_pad += 1
                else:
                    real.add(mb)
            L.close()
        return real.digests(), every.digests(), n_pad

    one, eight, sixteen = run(1), run(8), run(16)
    assert sixteen[0] == one[0] and len(one[0]) > 100
    assert sixteen == eight
    assert sixteen[2] > 0


# -- host layer: zephon_torch's DataLoader over RankSession, simulated ranks ---------------------------------------
HOST_KW = dict(canonical_replicas=4, global_batch_size=16, chunk_size=8, flush_every_k_chunks=1, shuffle=True, seed=3)


@pytest.fixture(scope="module")
def ids_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("ids")
    with open(d / "a.jsonl", "w") as f:
        for i in range(203):
            f.write(json.dumps({"id": i}) + "\n")
    return str(d)


def _torch_rank(ids_dir, dp, rank, drop_last=True, **kw):
    from zephon import Batch, open_dataset
    from zephon_torch import ZephonIterableDataset
    return ZephonIterableDataset([open_dataset(ids_dir)], [Batch(2, drop_last=drop_last)], dp_degree=dp,
                                 dp_rank=rank, **dict(HOST_KW, **kw))


def _host_steps(ids_dir, dp, *, workers=0, steps=None, state=None, drop_last=True, **kw):
    """Per step, ``{lane: [ids in row order]}`` (padding rows as -1) over the ``dp`` simulated ranks, rank by rank,
    from ``state``; and each rank's DataLoader state after ``steps`` steps (None: to the end of a finite pass)."""
    from zephon_torch import DataLoader
    out, states = {}, []
    for r in range(dp):
        ds = _torch_rank(ids_dir, dp, r, drop_last=drop_last, **kw)
        dl = DataLoader(ds, num_workers=workers, **({"multiprocessing_context": "fork"} if workers else {}))
        if state is not None:
            dl.load_state_dict(state)
        per = 2 // ds.plan.lane_shares  # 4 rows per lane step in micro-batches of 2, split over the sharing ranks
        last_micro = (ds.plan.share_index + 1) * per - 1
        for b in dl:
            pad = b.get("__pad__")
            for i, lane in enumerate(b["__lane__"].tolist()):
                out.setdefault(b["__step__"], {}).setdefault(lane, []).append(
                    -1 if pad is not None and bool(pad[i]) else int(b["id"][i]))
            if steps is not None and b["__step__"] == steps - 1 and b["__micro__"] == last_micro:
                break
        states.append(dl.state_dict())
    return out, states


@pytest.mark.parametrize("workers", [0, 2])
def test_torch_dataloader_at_dp8_on_4_lanes_matches_dp1_and_resumes(ids_dir, workers):
    """zephon_torch.DataLoader: 8 simulated ranks on 4 lanes give dp 1's global batches; a state saved there (8 rank
    states, merged) resumes at dp 2 with the rest of the uninterrupted order."""
    ref, _ = _host_steps(ids_dir, 1, steps=6)
    got, states = _host_steps(ids_dir, 8, workers=workers, steps=3)
    assert {s: got[s] for s in range(3)} == {s: ref[s] for s in range(3)}
    merged = json.loads(json.dumps(merge_states(states)))
    assert merged["step"] == 3
    rest, _ = _host_steps(ids_dir, 2, steps=6, state=merged)
    assert {s: rest[s] for s in range(3, 6)} == {s: ref[s] for s in range(3, 6)} and min(rest) == 3


@pytest.mark.parametrize("drop_last", [True, False])
def test_torch_dataloader_finite_pass_at_dp8_matches_dp1(ids_dir, drop_last):
    """A finite pass (exhaustion='stop'): the same rows per step and lane as dp 1, padding (-1) included without
    drop_last; with it, the same complete steps and nothing after."""
    ref, _ = _host_steps(ids_dir, 1, exhaustion="stop", drop_last=drop_last)
    got, _ = _host_steps(ids_dir, 8, exhaustion="stop", drop_last=drop_last)
    assert got == ref and len(ref) >= 12
    assert any(-1 in rows for s in ref.values() for rows in s.values()) != drop_last


def test_torchtitan_loader_at_dp_past_canonical_replicas(corpus, tokenizer_path):
    """TorchTitan: 4 lanes, a state saved at dp 2 restores at dp 8 (two ranks per lane): the 8 ranks' local
    batches of the next step, in rank order, are the dp 1 run's global batch of that step."""
    pytest.importorskip("torchtitan.components.dataloader", reason="torchtitan not installed")
    import torch
    from zephon_torch.titan import ZephonTextDataLoader

    cfg = ZephonTextDataLoader.Config(dataset_path=corpus["docs_jsonl"], canonical_replicas=4, shuffle_buffer=4,
                                      chunk_size=32)

    def make(dp, rank):
        return ZephonTextDataLoader(cfg, dp_world_size=dp, dp_rank=rank, tokenizer=tokenizer_path, seq_len=32,
                                    local_batch_size=16 // dp)
    ref = iter(make(1, 0))
    ref_steps = [next(ref)[0]["input"] for _ in range(3)]
    saved = []
    for r in range(2):
        dl = make(2, r)
        it = iter(dl)
        for s in range(2):
            assert torch.equal(next(it)[0]["input"], ref_steps[s][8 * r:8 * (r + 1)])
        saved.append(dl.state_dict())
    got = []
    for r in range(8):
        dl = make(8, r)
        dl.load_state_dict(saved[r // 4])  # lane r // 2 was rank r // 4's at dp 2 (no process group: rank states)
        got.append(next(iter(dl))[0]["input"])
    assert torch.equal(torch.cat(got), ref_steps[2])


def test_zephon_verify_64_lanes_at_dp_128_identical_to_dp1(corpus, tokenizer_path, capsys):
    from zephon.cli import main

    base = ["verify", "--data", corpus["docs_jsonl"], "--data", corpus["code_jsonl"], "--weights", "0.7,0.3",
            "--tokenizer", tokenizer_path, "--canonical-replicas", "64", "--max-length", "64", "--chunk-size", "8",
            "--no-progress", "--runner", "inline"]
    rc = main(base + ["--dp", "128", "--resume-dp", "32", "--global-batch-size", "128", "--checkpoint-step", "2",
                      "--steps", "4"])
    out = capsys.readouterr().out
    assert rc == 0, out
    assert "OK: all 4 steps' global-batch SHA-256 equal the uninterrupted dp=1 reference" in out
    # a dp 32 rank owns lanes 2r, 2r+1, saved by ranks 4r..4r+3 (2 per lane): it reads one entry per lane
    assert "each rank read at most 2 of the 128 rank entries" in out
    # the default global batch (64 lanes x 1 row) gives each lane 1 row per step: 2 ranks cannot split it
    assert main(base + ["--dp", "128", "--resume-dp", "64", "--checkpoint-step", "1", "--steps", "2"]) == 2
    assert "2 ranks share each lane, but the 1 rows a lane gives per step" in capsys.readouterr().err


# -- adapters that refuse lane sharing, by name -----------------------------------------------------------------------
def test_energon_refuses_more_ranks_than_lanes(tmp_path):
    pytest.importorskip("megatron.energon")
    import zephon_energon as ze
    from energon_data import text_dataset

    root, _ = text_dataset(str(tmp_path))
    with pytest.raises(TopologyError, match=r"world_size=8 is more than canonical_replicas=4 lanes: zephon_energon "
                                            r"gives each rank whole batches of batch_size=2"):
        ze.get_train_dataset(root, worker_config=ze.WorkerConfig(rank=0, world_size=8, num_workers=0), batch_size=2,
                             shuffle_buffer_size=None, max_samples_per_sequence=None, canonical_replicas=4)
