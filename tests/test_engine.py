"""Engine invariants: elastic determinism against an uninterrupted single-rank reference, runner
and micro-batch independence, checkpoint size and resume cost, iteration semantics."""
from __future__ import annotations

import json

import pytest

from zephon.checkpoint import merge_states
from zephon.engine.runners import InlineRunner

from helpers import StepHasher, make_loader, run_steps

STEPS, CKPT = 10, 4


@pytest.fixture(scope="module")
def reference(corpus, tokenizer_path):
    """Global-batch digests of one uninterrupted dp=1 run (the oracle)."""
    dirs = [corpus["docs_jsonl"], corpus["code_jsonl"]]
    h = StepHasher()
    L = make_loader(dirs, tokenizer_path, weights=[0.7, 0.3])
    run_steps([L], STEPS, h)
    L.close()
    d = h.digests()
    assert len(d) == STEPS and len(set(d.values())) == STEPS  # distinct batches: the check has teeth
    return d


@pytest.mark.parametrize("dp, resume_dp, runner, resume_runner, mb, resume_mb, assignment", [
    (4, 1, "inline", "threads", 1, 2, "contiguous"),
    (4, 2, "threads", "processes", 2, 1, "contiguous"),
    (4, 8, "inline", "inline", 1, 1, "interleaved"),
    (2, 4, "threads", "inline", 2, 2, "contiguous"),
    (8, 2, "processes", "threads", 1, 2, "interleaved"),
])
def test_elastic_resume_matches_uninterrupted_reference(corpus, tokenizer_path, reference, dp, resume_dp,
                                                         runner, resume_runner, mb, resume_mb, assignment):
    dirs = [corpus["docs_jsonl"], corpus["code_jsonl"]]
    h = StepHasher()
    first = [make_loader(dirs, tokenizer_path, weights=[0.7, 0.3], dp=dp, rank=r, runner=runner,
                         micro_batch=mb, lane_assignment=assignment) for r in range(dp)]
    run_steps(first, CKPT, h)
    state = json.loads(json.dumps(merge_states([L.checkpoint() for L in first])))
    for L in first:
        L.close()
    assert state["step"] == CKPT
    second = [make_loader(dirs, tokenizer_path, weights=[0.7, 0.3], dp=resume_dp, rank=r, runner=resume_runner,
                          micro_batch=resume_mb) for r in range(resume_dp)]
    for L in second:
        L.restore(state)
    run_steps(second, STEPS - CKPT, h)
    for L in second:
        L.close()
    got = h.digests()
    assert [s for s in range(STEPS) if got[s] != reference[s]] == []


def test_parquet_and_jsonl_give_identical_batches(corpus, tokenizer_path, reference):
    """Same documents in another format: same global batches (formats only read)."""
    h = StepHasher()
    L = make_loader([corpus["docs_parquet"], corpus["code_parquet"]], tokenizer_path, weights=[0.7, 0.3])
    run_steps([L], STEPS, h)
    L.close()
    assert h.digests() == reference


def test_a_new_iteration_continues_where_the_last_stopped(corpus, tokenizer_path, reference):
    h = StepHasher()
    L = make_loader([corpus["docs_jsonl"], corpus["code_jsonl"]], tokenizer_path, weights=[0.7, 0.3])
    run_steps([L], 3, h)
    run_steps([L], STEPS - 3, h)  # run_steps closes its iterators: this starts a second __iter__
    L.close()
    assert h.digests() == reference


def test_seed_changes_the_order(corpus, tokenizer_path, reference):
    h = StepHasher()
    L = make_loader([corpus["docs_jsonl"], corpus["code_jsonl"]], tokenizer_path, weights=[0.7, 0.3], seed=1)
    run_steps([L], 2, h)
    L.close()
    assert h.digests()[0] != reference[0]


def _checkpoint_after(corpus, tokenizer_path, steps, chunk_size):
    L = make_loader([corpus["docs_jsonl"]], tokenizer_path, canonical_replicas=64, chunk_size=chunk_size,
                    max_length=64, global_batch_size=64, shuffle_buffer=0, unit_size=16, flush_every_k_chunks=None)
    run_steps([L], steps, StepHasher())
    L.close()
    return json.dumps(L.checkpoint())


def test_checkpoint_size_is_flat_in_chunk_size_and_steps(corpus, tokenizer_path):
    small = _checkpoint_after(corpus, tokenizer_path, 2, 1024)
    big_chunks = _checkpoint_after(corpus, tokenizer_path, 2, 16384)
    longer = _checkpoint_after(corpus, tokenizer_path, 40, 1024)
    assert len(small) <= 64 * 1024
    assert abs(len(big_chunks) - len(small)) <= 2  # only the chunk_size digits in the config differ
    # per lane only counters grow, by digits: at most 64 lanes x 2 more digits x 3 counters
    assert len(longer) - len(small) <= 64 * 6
    lanes = json.loads(longer)["lanes"]
    lane_keys = ["delivered_rows", "lane", "replay_cursor", "sentinel_chunk", "sentinel_offset"]
    assert len(lanes) == 64 and all(sorted(e) == lane_keys for e in lanes)


class CountingRunner(InlineRunner):
    def __init__(self, stage):
        super().__init__(stage)
        self.units = 0
        self.pointers = 0  # what the work read (units vary in size: they start small and grow)

    def submit(self, ptrs):
        self.units += 1
        self.pointers += len(ptrs)
        return super().submit(ptrs)


@pytest.mark.parametrize("ckpt_step", [3, 30])
def test_resume_replays_only_the_inflight_span(corpus, tokenizer_path, ckpt_step):
    """Work to the first batch after a restore is bounded by the flush span (K chunks per lane),
    whatever the step."""
    kw = dict(canonical_replicas=4, chunk_size=16, flush_every_k_chunks=2, unit_size=8, max_length=64,
              shuffle_buffer=0)
    L = make_loader([corpus["docs_jsonl"]], tokenizer_path, **kw)
    run_steps([L], ckpt_step, StepHasher())
    state = L.checkpoint()
    L.close()
    R = make_loader([corpus["docs_jsonl"]], tokenizer_path, **kw)
    runner = CountingRunner(R.stage)
    R = make_loader([corpus["docs_jsonl"]], tokenizer_path, **kw)
    R._runner, R._owns_runner = runner, False
    R.restore(state)
    next(iter(R))
    span = 2 * 16
    # each lane replays at most its current span plus whatever the next row needs from the next span
    assert runner.pointers <= 4 * 2 * span + 4 * 8
    assert R.stats()["replayed_rows"] <= sum(1 for _ in range(10 ** 6)) and state["step"] == ckpt_step


def test_stats_count_replayed_rows_without_redelivering(corpus, tokenizer_path):
    dirs = [corpus["docs_jsonl"]]
    a = make_loader(dirs, tokenizer_path)
    h_ref = StepHasher()
    run_steps([a], 6, h_ref)
    b = make_loader(dirs, tokenizer_path)
    run_steps([b], 3, StepHasher())
    c = make_loader(dirs, tokenizer_path)
    c.restore(b.checkpoint())
    h = StepHasher()
    iters = iter(c)
    for _ in range(3 * 8 * 2):
        h.add(next(iters))
    assert c.stats()["delivered_rows"] == 6 * 16
    assert {s: d for s, d in h.digests().items()} == {s: h_ref.digests()[s] for s in (3, 4, 5)}


def test_local_aggregator_merges_once_every_rank_contributed(corpus, tokenizer_path):
    from zephon.checkpoint import LocalAggregator
    from zephon.checkpoint import CheckpointError

    ranks = [make_loader([corpus["docs_jsonl"]], tokenizer_path, dp=4, rank=r) for r in range(4)]
    agg = LocalAggregator(4)
    results = [agg.gather(r, L.checkpoint()) for r, L in enumerate(ranks)]
    assert results[:3] == [None, None, None]
    assert [e["lane"] for e in results[3]["lanes"]] == list(range(8))
    agg.gather(0, ranks[0].checkpoint())
    with pytest.raises(CheckpointError, match="twice"):
        agg.gather(0, ranks[0].checkpoint())


def test_a_runner_built_for_another_config_is_refused(corpus, tokenizer_path):
    from zephon.engine import make_runner

    other = make_loader([corpus["code_jsonl"]], tokenizer_path)
    runner = make_runner("inline", other.stage)
    with pytest.raises(ValueError, match="shared runner"):
        make_loader([corpus["docs_jsonl"]], tokenizer_path, runner=runner)


def _token_shares(loader, steps):
    import numpy as np

    tokens = np.zeros(2)
    it = iter(loader)
    for _ in range(steps * len(loader.lanes) * 2):
        mb = next(it)
        for srcs, cu in zip(mb["__src__"], mb["cu_seqlens"]):
            positions = np.array([p for p, _ in srcs], dtype=np.int64)
            ds, _ = loader.source.mixture.assign(positions)
            np.add.at(tokens, ds, np.diff(cu))
    it.close()
    loader.close()
    return tokens / tokens.sum()


def test_token_level_mixture_correction_hits_token_shares(corpus, tokenizer_path):
    """Docstrings are much shorter than code blocks: mixing 1:1 by samples gives far from 1:1 tokens;
    corrected weights + EnsureMixture bring the delivered token shares close to 1:1."""
    from zephon.ops import Decode, EnsureMixture, Tokenize, token_corrected_weights

    dirs = [corpus["docs_jsonl"], corpus["code_jsonl"]]
    plain = _token_shares(make_loader(dirs, tokenizer_path, weights=[1, 1], shuffle_buffer=0), 40)
    base = make_loader(dirs, tokenizer_path)
    dec, tok = Decode(), Tokenize(tokenizer_path, eos_id="<eos>")
    w = token_corrected_weights(base.datasets, [1, 1], lambda rs: [r["num_tokens"] for r in
                                                                   tok.process_many(dec.process_many(rs))],
                                sample_size=2000)
    fixed = _token_shares(make_loader(dirs, tokenizer_path, weights=w, shuffle_buffer=0), 40)
    assert abs(plain[0] - 0.5) > 0.2          # the problem is real on this corpus
    assert abs(fixed[0] - 0.5) < 0.05         # and the correction fixes it
    with_acc = make_loader(dirs, tokenizer_path, weights=w, shuffle_buffer=0, pre_pack_ops=[EnsureMixture([1, 1])])
    assert abs(_token_shares(with_acc, 40)[0] - 0.5) < 0.05


def test_ragged_per_rank_checkpoint_resumes_in_step_order(corpus, tokenizer_path, reference):
    """Ranks checkpointed at different points (mid-step, different steps): after the merge, a resumed
    rank delivers step s of every lane before step s+1, and the union equals the reference."""
    dirs = [corpus["docs_jsonl"], corpus["code_jsonl"]]
    h = StepHasher()
    first = [make_loader(dirs, tokenizer_path, weights=[0.7, 0.3], dp=4, rank=r) for r in range(4)]
    for L, pulls in zip(first, (10, 9, 12, 13)):
        it = iter(L)
        for _ in range(pulls):
            h.add(next(it))
        it.close()
    state = merge_states([L.checkpoint() for L in first])
    second = make_loader(dirs, tokenizer_path, weights=[0.7, 0.3], dp=2, rank=0)
    other = make_loader(dirs, tokenizer_path, weights=[0.7, 0.3], dp=2, rank=1)
    steps_seen = []
    for L in (second, other):
        L.restore(state)
        it = iter(L)
        while True:
            mb = next(it)
            if mb["__step__"] >= STEPS:
                break
            steps_seen.append((L.dp_rank, mb["__step__"]))
            h.add(mb)
        it.close()
    for rank in (0, 1):
        seq = [s for r, s in steps_seen if r == rank]
        assert seq == sorted(seq)
    assert h.digests() == reference


def test_finite_stream_with_drop_last_yields_only_complete_steps_and_counts_the_rest(corpus, tokenizer_path):
    kw = dict(canonical_replicas=4, global_batch_size=8, exhaustion="stop", max_length=64, shuffle_buffer=0)
    tokens = 0  # real tokens of the whole pass (drop_last=False pads its last steps instead of dropping)
    for r in range(2):
        L = make_loader([corpus["code_jsonl"]], tokenizer_path, dp=2, rank=r, drop_last=False, **kw)
        tokens += sum(int(mb["attention_mask"].sum()) for mb in L)
    kept, dropped = 0, 0
    for r in range(2):
        L = make_loader([corpus["code_jsonl"]], tokenizer_path, dp=2, rank=r, drop_last=True, **kw)
        per_step = {}
        for mb in L:
            per_step.setdefault(mb["__step__"], []).append(len(mb["input_ids"]))
            kept += int(mb["attention_mask"].sum())
        assert all(sum(v) == len(L.lanes) * 2 for v in per_step.values())
        assert sorted(per_step) == list(range(len(per_step)))
        dropped += L.stats()["dropped_rows"]
    # drop_last plans whole rows per lane (ALGORITHM_VERSION 4), so its rows differ from the padded pass's; every
    # token it did not deliver sits in a counted dropped row (at most max_length each)
    assert 0 <= tokens - kept <= dropped * kw["max_length"], (tokens, kept, dropped)


@pytest.mark.parametrize("runner", ["inline", "threads"])
def test_sentinels_inside_chunks_resume_exactly_and_cheaply(corpus, tokenizer_path, runner):
    """flush_every_k_chunks=0.125: eight replay spans per chunk, so a resume replays at most an eighth
    of a chunk per lane (big chunks need not mean expensive resumes)."""
    dirs = [corpus["docs_jsonl"]]
    kw = dict(chunk_size=128, flush_every_k_chunks=0.125, unit_size=64, max_length=128)
    ref = StepHasher()
    L = make_loader(dirs, tokenizer_path, **kw)
    run_steps([L], 16, ref)
    h = StepHasher()
    first = [make_loader(dirs, tokenizer_path, dp=2, rank=r, runner=runner, **kw) for r in range(2)]
    run_steps(first, 11, h)
    state = merge_states([x.checkpoint() for x in first])
    assert any(e["sentinel_offset"] for e in state["lanes"])  # sentinels really fall inside chunks
    second = [make_loader(dirs, tokenizer_path, dp=4, rank=r, **kw) for r in range(4)]
    for x in second:
        x.restore(state)
    runner_counts = [CountingRunner(x.stage) for x in second]
    for x, c in zip(second, runner_counts):
        x._runner, x._owns_runner = c, False
    run_steps(second, 5, h)
    assert h.digests() == ref.digests()
    # a lane replays at most one span (16 pointers) plus what its next 5 steps need (under 5 spans here)
    assert all(c.pointers <= 6 * 16 * len(x.lanes) for c, x in zip(runner_counts, second))
    with pytest.raises(ValueError, match="whole number of pointers"):
        make_loader(dirs, tokenizer_path, chunk_size=128, flush_every_k_chunks=0.3)


def test_an_older_iterator_stops_after_a_new_iter_or_restore(corpus, tokenizer_path):
    L = make_loader([corpus["docs_jsonl"]], tokenizer_path)
    first = iter(L)
    for _ in range(3):
        next(first)
    second = iter(L)
    for _ in range(3):
        next(second)
    with pytest.raises(RuntimeError, match="superseded"):
        next(first)
    assert sum(e["delivered_rows"] for e in L.checkpoint()["lanes"]) == 6  # what was yielded, once
    L.restore(L.checkpoint())
    with pytest.raises(RuntimeError, match="superseded"):
        next(second)
