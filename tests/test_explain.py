"""``Loader.explain``: every row of a global step named from the config, checked against what an uninterrupted
Loader delivered (its rows' source ids and tokens) and against the files themselves (the named line and byte range
read here with ``json``, tokenized here); and skipped step ranges on resume, checked against the uninterrupted
stream with those steps taken out, across two further resumes at other dp. The scheduled pipeline, diff and the
torch and Energon adapters are ``slow``: ``pytest -m slow tests/test_explain.py``."""
from __future__ import annotations

import json

import pytest
from tokenizers import Tokenizer

from helpers import StepHasher, make_loader, run_steps
from zephon.checkpoint import CheckpointError, merge_states
from zephon.engine import Loader
from zephon.formats import open_dataset
from zephon.ops import Batch, Decode, Shuffle
from zephon.work import Schedule

MAX_LEN = 128


@pytest.fixture(scope="module")
def dirs(corpus):
    return [corpus["docs_jsonl"], corpus["code_jsonl"]]


def delivered(loaders, steps):
    """``{(step, lane, micro, row): row's __src__ and input_ids}`` of ``steps`` global steps of ``loaders`` (the
    ranks of one run), pulled as a training loop does."""
    out, iters = {}, [iter(L) for L in loaders]
    for _ in range(steps):
        for L, it in zip(loaders, iters):
            for _ in range(len(L.lanes) * (L.rows_per_lane_step // L.batch.micro_batch_size)):
                mb = next(it)
                for i, src in enumerate(mb["__src__"]):
                    ids = mb["input_ids"][i] if "input_ids" in mb else None
                    text = mb["text"][i] if "text" in mb else None
                    out[(mb["__step__"], mb["__lane__"], mb["__micro__"], i)] = (src, ids, text)
    for it in iters:
        it.close()
    return out


def read_line(piece):
    """The document at the piece's file, line and byte range, read here (both must agree)."""
    with open(piece["file"], "rb") as fh:
        lines = fh.read().split(b"\n")
        fh.seek(piece["bytes"][0])
        raw = fh.read(piece["bytes"][1] - piece["bytes"][0])
    assert raw.rstrip(b"\n") == lines[piece["line"] - 1]
    return json.loads(raw)["text"]


def check_rows(ex, got, tokenizer_path=None, packed=False):
    """``explain``'s rows against delivered ones (``got``: key -> (__src__ or None, input_ids, text)): the same keys,
    the same source ids, and each piece's tokens (re-tokenized here from the file) where the row holds them."""
    tok = Tokenizer.from_file(tokenizer_path) if tokenizer_path else None
    assert {(r["step"], r["lane"], r["micro"], r["row"]) for r in ex["rows"]} == set(got)
    for r in ex["rows"]:
        src, ids, text = got[(r["step"], r["lane"], r["micro"], r["row"])]
        pieces = r["pieces"]
        assert pieces or not packed
        if src is None:
            pass
        elif isinstance(src, list):  # packed: (position, piece) per document
            assert [tuple(x) for x in src] == [(p["position"], p["piece"]) for p in pieces]
        else:
            assert tuple(src) == (pieces[0]["dataset"], pieces[0]["shard"], pieces[0]["sample"],
                                  pieces[0]["position"])
        for p in pieces:
            doc = read_line(p)
            if tok is None:
                assert doc == text
                continue
            full = tok.encode(doc, add_special_tokens=False).ids + [tok.token_to_id("<eos>")]
            a, b = p["tokens"]
            want = full[p["piece"] * MAX_LEN:(p["piece"] + 1) * MAX_LEN]
            assert list(ids[a:b]) == want, (r, p)


def plain_loader(dirs, dp=1, rank=0, runner="inline", **kw):
    datasets = [open_dataset(d) for d in dirs]
    return Loader(datasets, [Decode("text"), Shuffle(8, seed=1), Batch(2)], weights=[2, 1], canonical_replicas=8,
                  chunk_size=16, global_batch_size=32, dp_degree=dp, dp_rank=rank, runner=runner, **kw)


SCHEDULE = [{"linear": {0: 3, 6: 1}}, {"linear": {0: 1, 6: 3}}]


@pytest.mark.parametrize("kind", ["packed", "plain", pytest.param("scheduled", marks=pytest.mark.slow)])
def test_explain_names_what_an_uninterrupted_loader_delivered(dirs, tokenizer_path, kind):
    steps = 14
    if kind == "plain":
        ref = delivered([plain_loader(dirs)], steps)
        ranks = [plain_loader(dirs, 8, r, "threads", num_workers=2) for r in range(8)]
    else:
        kw = {"weights": Schedule(SCHEDULE)} if kind == "scheduled" else {}
        ref = delivered([make_loader(dirs, tokenizer_path, micro_batch=2, max_length=MAX_LEN, **kw)], steps)
        ranks = [make_loader(dirs, tokenizer_path, dp=8, rank=r, runner="threads", micro_batch=2,
                             max_length=MAX_LEN, **kw) for r in range(8)]
    at_dp8 = delivered(ranks, steps)
    assert set(at_dp8) == set(ref) and all(str(at_dp8[k][0]) == str(ref[k][0]) for k in ref)
    for step in (0, 5, steps - 2):
        want = {k: v for k, v in ref.items() if step <= k[0] < step + 2}
        check_rows(ranks[3].explain(range(step, step + 2)), want, None if kind == "plain" else tokenizer_path)
    ex = ranks[0].explain(steps - 1)
    lanes_of_rank = {r: set(L.lanes) for r, L in enumerate(ranks)}
    assert all(row["lane"] in lanes_of_rank[row["rank"]] for row in ex["rows"])


def test_plain_explain_reads_one_span_per_lane_at_any_step(dirs):
    L = plain_loader(dirs)
    span = L.plan.flush_span
    assert L.explain(10 ** 6)["replayed_pointers"] <= span
    far = L.explain(10 ** 6)["rows"]
    # the oracle: a lane of a plain pipeline delivers its pointers in spans; row k of the lane is in span k // span
    lane_rows = 10 ** 6 * L.rows_per_lane_step
    positions = {p["position"] for r in far if r["lane"] == 0 for p in r["pieces"]}
    span_ptrs = set()
    first = lane_rows // span * span
    for c in range(first // L.source.chunk_size, (first + 2 * span) // L.source.chunk_size + 1):
        span_ptrs |= set(int(x) for x in L.source.chunk(0, c).positions)
    assert positions <= span_ptrs


def test_packed_explain_from_a_checkpoint_replays_from_it(dirs, tokenizer_path):
    kw = {"micro_batch": 2, "flush_every_k_chunks": 0.25}  # spans of 8 pointers: a checkpoint at step 20 is far in
    ref = delivered([make_loader(dirs, tokenizer_path, **kw)], 24)
    ranks = [make_loader(dirs, tokenizer_path, dp=2, rank=r, **kw) for r in range(2)]
    delivered(ranks, 21)
    state = json.loads(json.dumps(merge_states([L.checkpoint() for L in ranks])))
    fresh = make_loader(dirs, tokenizer_path, dp=4, rank=1, **kw)
    ex = fresh.explain(range(22, 24), state=state)
    check_rows(ex, {k: v for k, v in ref.items() if k[0] in (22, 23)}, tokenizer_path)
    # from the checkpoint: its span and the rows after it; without it, every pointer of the lane from its start
    from_start = fresh.explain(range(22, 24))
    check_rows(from_start, {k: v for k, v in ref.items() if k[0] in (22, 23)}, tokenizer_path)
    assert ex["replayed_pointers"] <= 2 * fresh.plan.flush_span < from_start["replayed_pointers"]


# ------------------------------------------------------------------------------------------ skipped steps

def digests_run(dirs, tokenizer_path, dp, steps, state=None, skip=None, runner="inline"):
    loaders = [make_loader(dirs, tokenizer_path, dp=dp, rank=r, runner=runner, micro_batch=2) for r in range(dp)]
    if state is not None:
        for L in loaders:
            L.restore(state, skip_steps=skip)
    h = StepHasher()
    run_steps(loaders, steps, h)
    return h.digests(), json.loads(json.dumps(merge_states([L.checkpoint() for L in loaders]))), loaders


def test_skips_remove_exactly_those_steps_across_resumes_at_other_dp(dirs, tokenizer_path):
    ref, _, _ = digests_run(dirs, tokenizer_path, 1, 40)
    d1, state, _ = digests_run(dirs, tokenizer_path, 2, 6)
    d2, state, loaders = digests_run(dirs, tokenizer_path, 4, 8, state, skip=(9, 12))  # steps 6..13
    assert state["config"]["skips"] == [[9, 12]]
    d3, state, _ = digests_run(dirs, tokenizer_path, 8, 6, state, skip=[(15, 17), (19, 20)])  # steps 14..19
    d4, _, _ = digests_run(dirs, tokenizer_path, 1, 4, state, runner="threads")  # steps 20..23, skips kept
    got = {**d1, **d2, **d3, **d4}
    # training step t delivers stream step: 9..11 removed, then (in the new numbering) 15..16, then (counted
    # after those) 19
    stream = [s for s in range(40) if s not in (9, 10, 11)]
    stream = [s for i, s in enumerate(stream) if i not in (15, 16)]
    stream = [s for i, s in enumerate(stream) if i != 19]
    assert sorted(got) == list(range(24))
    assert [got[t] for t in range(24)] == [ref[s] for s in stream[:24]]
    ex = loaders[0].explain(range(9, 10))
    assert {r["stream_step"] for r in ex["rows"]} == {12}


def test_skip_before_the_checkpoint_is_refused_naming_the_step(dirs, tokenizer_path):
    _, state, _ = digests_run(dirs, tokenizer_path, 2, 6)
    L = make_loader(dirs, tokenizer_path, micro_batch=2)
    with pytest.raises(CheckpointError, match="before the checkpoint's step 6"):
        L.restore(state, skip_steps=(5, 9))
    with pytest.raises(CheckpointError, match="0 <= first < end"):
        L.restore(state, skip_steps=(9, 9))


def test_a_checkpoint_without_skips_keeps_its_keys(dirs, tokenizer_path):
    _, state, _ = digests_run(dirs, tokenizer_path, 2, 3)
    assert "skips" not in state["config"]
    assert all("skipped_rows" not in e for e in state["lanes"])


# ------------------------------------------------------------------------------------------ diff

def first_differing_delivered(a, b, steps):
    """Oracle: the first step at which two uninterrupted loaders' delivered rows differ (source ids and tokens)."""
    da, db = delivered([a], steps), delivered([b], steps)
    for s in range(steps):
        keys = sorted(k for k in da if k[0] == s)
        if keys != sorted(k for k in db if k[0] == s) or any(
                str(da[k][0]) != str(db[k][0]) or list(da[k][1]) != list(db[k][1]) for k in keys):
            return s
    return None


@pytest.mark.slow  # ~8 s
def test_diff_names_the_first_step_a_shuffle_buffer_or_an_appended_phase_moves(dirs, tokenizer_path):
    from zephon.engine.diff import compare_plans

    kw = {"micro_batch": 2, "flush_every_k_chunks": 0.25}
    old = make_loader(dirs, tokenizer_path, shuffle_buffer=4, **kw)
    new = make_loader(dirs, tokenizer_path, shuffle_buffer=6, **kw)
    report = compare_plans(old.plan, new.plan, 12)
    assert report["first_differing_step"] == first_differing_delivered(old, new, 12) is not None
    assert sum(report["moved"].values()) > 0 and any("buffer_size" in c for c in report["config"])
    same = compare_plans(old.plan, make_loader(dirs, tokenizer_path, shuffle_buffer=4, dp=4, **kw).plan, 6)
    assert same["first_differing_step"] is None and set(same["moved"].values()) == {0}
    base = [{"linear": {0: 3, 6: 1}}, {"linear": {0: 1, 6: 3}}]
    appended = [{"linear": {0: 3, 6: 1, 9: 1, 10: 0}}, {"linear": {0: 1, 6: 3}}]  # a phase from step 10 on
    a = make_loader(dirs, tokenizer_path, weights=Schedule(base), **kw)
    b = make_loader(dirs, tokenizer_path, weights=Schedule(appended), **kw)
    report = compare_plans(a.plan, b.plan, 14)
    assert report["first_differing_step"] == first_differing_delivered(a, b, 14)
    # packed rows gather documents ahead of their step: the new phase's documents reach batches before step 10
    assert report["first_differing_step"] is not None and report["first_differing_step"] <= 10


def test_cli_explain_and_diff(dirs, tokenizer_path, capsys):
    from zephon.cli import main

    flags = ["--data", dirs[0], "--data", dirs[1], "--tokenizer", tokenizer_path, "--eos-token", "<eos>",
             "--canonical-replicas", "4", "--max-length", "128", "--dp", "2", "--chunk-size", "16"]
    assert main(["explain", "3", "--json", *flags]) == 0
    ex = json.loads(capsys.readouterr().out)
    assert {r["lane"] for r in ex["rows"]} == {0, 1, 2, 3} and all(r["step"] == 3 for r in ex["rows"])
    for r in ex["rows"]:
        for p in r["pieces"]:
            read_line(p)
    assert main(["explain", "2:4", *flags, "--text"]) == 0
    out = capsys.readouterr().out
    assert out.count("\n   2  (     2)") >= 4 and "    | " in out
    assert main(["diff", *flags, "--against", "--shuffle-buffer 8", "--compare-steps", "6"]) == 0
    out = capsys.readouterr().out
    assert "first global step whose batch differs: " in out and "buffer_size" in out
    assert main(["explain", "x", *flags]) == 2


# ------------------------------------------------------------------------------------------ a host adapter

@pytest.mark.slow  # ~20 s: run with -m slow
def test_torch_adapter_explains_its_rows_and_skips_through_its_state(dirs, tokenizer_path):
    pytest.importorskip("torch")
    import zephon_torch
    from torch_jobs import make_dataset
    from zephon.checkpoint import skip_in_state

    def run(dp, workers, stop, state=None):
        got, states = {}, []
        for r in range(dp):
            dl = zephon_torch.StatefulDataLoader(make_dataset(dirs, tokenizer_path, dp=dp, rank=r),
                                                 num_workers=workers)
            if state is not None:
                dl.load_state_dict(state)
            per_step = len(dl.dataset.plan.rank_lanes) * dl.dataset.plan.rows_per_lane_step
            mine = set()
            for b in dl:
                lanes = b["__lane__"].reshape(-1).tolist() * (len(b["input_ids"]) if b["__lane__"].ndim == 0 else 1)
                for i, lane in enumerate(lanes):
                    row = lanes[:i].count(lane)  # rows of the same lane before it in this batch
                    key = (int(b["__step__"]), int(lane), int(b["__micro__"]), row)
                    got[key] = b["input_ids"][i].numpy()
                    mine.add(key)
                if sum(k[0] == stop - 1 for k in mine) == per_step:
                    break
            states.append(dl.state_dict())
        return got, merge_states(states), dl.dataset

    ref, _, ds = run(1, 0, 8)
    ex = ds.explain(range(5, 8))
    check_rows(ex, {k: (None, v, None) for k, v in ref.items() if k[0] >= 5}, tokenizer_path, packed=True)
    _, state, _ = run(2, 2, 3)
    skipping = json.loads(json.dumps(skip_in_state(state, (4, 6))))
    got, state, ds = run(4, 0, 6, skipping)  # steps 3..5 deliver stream steps 3, 6, 7
    assert ds.plan.skips == [[4, 6]] and state["config"]["skips"] == [[4, 6]]
    ex = ds.explain(range(3, 6))
    assert [r["stream_step"] for r in ex["rows"] if r["lane"] == 0 and r["micro"] == 0] == [3, 6, 7]
    check_rows(ex, {k: (None, v, None) for k, v in got.items() if k[0] >= 3}, tokenizer_path, packed=True)


def test_cli_verify_checks_a_skip(dirs, tokenizer_path, capsys):
    from zephon.cli import main

    flags = ["--data", dirs[0], "--data", dirs[1], "--tokenizer", tokenizer_path, "--eos-token", "<eos>",
             "--canonical-replicas", "4", "--max-length", "128", "--chunk-size", "16", "--dp", "2",
             "--resume-dp", "4,1", "--checkpoint-step", "3", "--steps", "8", "--no-progress", "--workers", "1"]
    assert main(["verify", *flags, "--skip", "4:6"]) == 0
    out = capsys.readouterr().out
    assert "OK: all" in out and "MISMATCH" not in out
    assert main(["verify", *flags, "--skip", "2:6"]) == 2
    assert "starts before --checkpoint-step 3" in capsys.readouterr().err


def test_streaming_adapter_explains_its_epoch(tmp_path):
    pytest.importorskip("torch")
    from helpers import world, write_split_jsonl
    from zephon_streaming import StreamingDataset

    local = write_split_jsonl(str(tmp_path), "a", 3, 40, 0)
    with world(0, 1):
        ds = StreamingDataset(local=local, split="train", batch_size=8, shuffle=True, shuffle_seed=3, chunk_size=4,
                              aggregate_dir=str(tmp_path / "agg"))
    ids = [int(s["id"]) for s in ds]  # one rank: the global order, 8 rows per global step
    steps = len(ids) // 8
    ex = ds.explain(range(0, steps), epoch=0)
    for step in range(steps):
        named = [json.loads(read_line_raw(p))["id"] for r in ex["rows"] if r["step"] == step for p in r["pieces"]]
        assert sorted(named) == sorted(ids[step * 8:(step + 1) * 8]), step


def read_line_raw(piece):
    with open(piece["file"], "rb") as fh:
        fh.seek(piece["bytes"][0])
        return fh.read(piece["bytes"][1] - piece["bytes"][0])


@pytest.mark.slow  # ~10 s
def test_energon_adapter_explains_its_steps(tmp_path):
    pytest.importorskip("torch")
    pytest.importorskip("megatron.energon")
    wds = pytest.importorskip("webdataset")
    import zephon_energon as ze
    from megatron.energon.epathlib import EPath
    from megatron.energon.flavors.webdataset.base_webdataset import BaseWebdatasetFactory

    with wds.ShardWriter(str(tmp_path / "data-%03d.tar"), maxcount=30, verbose=0) as w:
        for i in range(90):
            w.write({"__key__": f"s{i:05d}", "txt": f"sample {i}"})
    BaseWebdatasetFactory.prepare_dataset(EPath(str(tmp_path)), sorted(p.name for p in tmp_path.glob("*.tar")),
                                          split_parts_patterns=[("train", r"data-.*\.tar")], shuffle_seed=None,
                                          workers=1)
    with open(tmp_path / ".nv-meta" / "dataset.yaml", "w") as fh:
        fh.write("__module__: megatron.energon\n__class__: StandardWebdatasetFactory\nfield_map:\n  text: txt\n"
                 "sample_type:\n  __module__: megatron.energon\n  __class__: TextSample\n")
    ds = ze.get_train_dataset(str(tmp_path), worker_config=ze.WorkerConfig(rank=0, world_size=1, num_workers=0),
                              batch_size=2, max_samples_per_sequence=None, shuffle_buffer_size=4,
                              canonical_replicas=4)
    keys = []
    for b in ze.get_savable_loader(ds):
        keys += list(b.__key__)
        if len(keys) >= 6 * ds.plan.global_batch_size:
            break
    gbs = ds.plan.global_batch_size
    ex = ds.explain(range(0, 6))
    for step in range(6):
        named = [ds.plan.datasets[p["dataset"]].read(p["shard"], [p["sample"]])[0]["__key__"]
                 for r in ex["rows"] if r["step"] == step for p in r["pieces"]]
        assert sorted(named) == sorted(keys[step * gbs:(step + 1) * gbs]), step
