"""zephon_torch in one process: DataLoader workers split lanes, state survives num_workers and dp changes.

Oracle: an uninterrupted single-rank core Loader (``helpers.make_loader``), hashed by the test-side
``StepHasher``; the torch runs are hashed by ``torch_jobs.step_digests`` from the yielded tensors.
"""
from __future__ import annotations

import gc
import json
import threading

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("torchdata")

import zephon_torch  # noqa: E402
from helpers import REQUIRED, StepHasher, host_keywords, make_loader, reference_digests, wait_until  # noqa: E402
from torch_jobs import R, consume, make_dataset, rows_of, small_corpus, step_digests  # noqa: E402
from zephon.checkpoint import CheckpointError, merge_states  # noqa: E402

STEPS = 8


@pytest.fixture(scope="module")
def dirs(corpus):
    return [corpus["docs_jsonl"], corpus["code_jsonl"]]


@pytest.fixture(scope="module")
def reference(dirs, tokenizer_path):
    return reference_digests(dirs, tokenizer_path, STEPS)


def run_ranks(dirs, tok, dp, num_workers, stop, *, state=None, cls=None, micro_batch=1):
    """Each rank's loader up to the end of step ``stop - 1``: (rows, merged state)."""
    cls = cls or zephon_torch.StatefulDataLoader
    rows, states = [], []
    for r in range(dp):
        dl = cls(make_dataset(dirs, tok, dp=dp, rank=r, micro_batch=micro_batch), num_workers=num_workers)
        if state is not None:
            dl.load_state_dict(state)
        rows.extend(consume(dl, stop, 2 // micro_batch))
        states.append(dl.state_dict())
    return rows, merge_states(states)


@pytest.mark.contract("torch.dataloader")
@pytest.mark.parametrize("cls", ["DataLoader", "StatefulDataLoader"])
@pytest.mark.parametrize("num_workers", [0, 2, 3])
def test_workers_reproduce_the_global_batches(dirs, tokenizer_path, reference, cls, num_workers):
    rows, _ = run_ranks(dirs, tokenizer_path, 2, num_workers, STEPS, cls=getattr(zephon_torch, cls))
    assert step_digests(rows) == reference


@pytest.mark.contract("torch.stateful")
@pytest.mark.parametrize("save_workers,resume", [(2, [(1, 0), (4, 3)]), (0, [(8, 2), (2, 1)])])
def test_resume_at_other_worker_counts_and_dp(dirs, tokenizer_path, reference, save_workers, resume):
    _, state = run_ranks(dirs, tokenizer_path, 2, save_workers, 3)
    json.dumps(state)  # plain JSON data
    assert state["step"] == 3
    for dp, nw in resume:
        rows, _ = run_ranks(dirs, tokenizer_path, dp, nw, STEPS, state=state, cls=zephon_torch.DataLoader)
        got = step_digests(rows)
        assert sorted(got) == list(range(3, STEPS))
        assert got == {s: reference[s] for s in range(3, STEPS)}, (dp, nw)


@pytest.mark.contract("torch.stateful")
def test_mid_step_checkpoint_resumes_exactly(dirs, tokenizer_path, reference):
    """Stop after micro-batch 0 of step 2 (micro_batch 1: 2 micro-batches per step), resume elsewhere."""
    states, before = [], []
    for r in range(2):
        dl = zephon_torch.StatefulDataLoader(make_dataset(dirs, tokenizer_path, dp=2, rank=r), num_workers=2)
        for b in dl:
            before.extend(rows_of(b))
            if (b["__step__"], b["__micro__"]) == (2, 0):
                break
        states.append(dl.state_dict())
    state = merge_states(states)
    assert {e["delivered_rows"] for e in state["lanes"]} == {5}  # 2 steps x 2 rows + 1
    after, _ = run_ranks(dirs, tokenizer_path, 4, 3, STEPS, state=state)
    assert step_digests(before + after) == reference


def _rows_through(dl, steps: int, have=()) -> list:
    """Rows of ``dl``'s lane micro-batches (torchdata's own loader: one item per lane micro-batch) until every
    step below ``steps`` is complete (``2 * R`` rows each), counting the rows in ``have``."""
    rows, need = [], steps * 2 * R
    done = sum(1 for r in have if r[0] < steps)
    for b in dl:
        got = rows_of(b)
        rows.extend(got)
        done += sum(1 for r in got if r[0] < steps)
        if done >= need:
            break
    return rows


@pytest.mark.contract("torch.stateful")
@pytest.mark.parametrize("num_workers", [2, 3])
def test_torchdata_stateful_dataloader_resumes_at_the_same_worker_count(dirs, tokenizer_path, reference,
                                                                        num_workers):
    """torchdata's own StatefulDataLoader restores each worker from its own state (its per-worker protocol):
    a worker's state holds only its lanes, and the resumed run equals the uninterrupted reference."""
    from torchdata.stateful_dataloader import StatefulDataLoader as TDL

    dl = TDL(make_dataset(dirs, tokenizer_path, dp=1, rank=0), batch_size=None, num_workers=num_workers)
    before = []
    for i, b in enumerate(dl):
        before.extend(rows_of(b))
        if i == 5:
            break
    state = dl.state_dict()
    dl2 = TDL(make_dataset(dirs, tokenizer_path, dp=1, rank=0), batch_size=None, num_workers=num_workers)
    dl2.load_state_dict(state)
    rows = before + _rows_through(dl2, STEPS, before)
    assert step_digests([r for r in rows if r[0] < STEPS]) == reference


@pytest.mark.contract("torch.dataloader")
def test_new_iter_continues_where_consumption_stopped(dirs, tokenizer_path, reference):
    dl = zephon_torch.DataLoader(make_dataset(dirs, tokenizer_path, dp=1, rank=0), num_workers=2)
    rows = consume(dl, 2, 2)  # workers prefetched beyond this: those rows must not be lost
    rows += consume(dl, 5, 2)
    assert step_digests(rows) == {s: reference[s] for s in range(5)}


@pytest.mark.contract("torch.dataloader")
def test_plain_torch_dataloader_round_robin_is_the_rank_order(dirs, tokenizer_path):
    ds = make_dataset(dirs, tokenizer_path, dp=2, rank=1)
    dl = torch.utils.data.DataLoader(ds, batch_size=None, num_workers=2)
    seen = []
    for mb in dl:
        seen.append((mb["__step__"], mb["__micro__"], mb["__lane__"]))
        if len(seen) == 3 * 2 * 4:
            break
    lanes = list(range(4, 8))
    assert seen == [(s, j, lane) for s in range(3) for j in range(2) for lane in lanes]


@pytest.mark.contract("torch.stateful")
def test_other_config_and_missing_lanes_are_refused(dirs, tokenizer_path):
    dl = zephon_torch.StatefulDataLoader(make_dataset(dirs, tokenizer_path, dp=2, rank=0), num_workers=0)
    consume(dl, 1, 2)
    rank0 = dl.state_dict()
    other = zephon_torch.DataLoader(make_dataset(dirs, tokenizer_path, dp=2, rank=1), num_workers=0)
    with pytest.raises(CheckpointError, match=r"rank 0 of dp 2 .*needs the states of old ranks \[1\]: pass "
                                              r"zephon.host.SavedRanks"):
        other.load_state_dict(rank0)
    from zephon.ops import Batch, Decode, Pack, Tokenize

    ds = zephon_torch.ZephonIterableDataset(
        make_dataset(dirs, tokenizer_path, dp=2, rank=0).plan.datasets,
        [Decode("text"), Tokenize(tokenizer_path, eos_id="<eos>", max_length=128), Pack(128), Batch(1)],
        dp_degree=2, dp_rank=0, seed=1, canonical_replicas=R, chunk_size=32, global_batch_size=2 * R,
        flush_every_k_chunks=2)
    with pytest.raises(CheckpointError, match="seed"):
        zephon_torch.DataLoader(ds).load_state_dict(rank0)


def test_bad_arguments_are_refused(dirs, tokenizer_path):
    ds = make_dataset(dirs, tokenizer_path, dp=1, rank=0)
    with pytest.raises(ValueError, match="batch_size must be None"):
        zephon_torch.DataLoader(ds, batch_size=4)
    with pytest.raises(ValueError, match="persistent_workers"):
        zephon_torch.StatefulDataLoader(ds, num_workers=2, persistent_workers=True)
    with pytest.raises(TypeError, match="ZephonIterableDataset"):
        zephon_torch.DataLoader(list(range(3)))


@pytest.mark.contract("torchtitan.loader")
def test_torchtitan_loader_contract(corpus, tokenizer_path):
    from zephon_torch.titan import ZephonTextDataLoader

    titan = pytest.importorskip("torchtitan.components.dataloader", reason="torchtitan not installed")
    cfg = ZephonTextDataLoader.Config(dataset_path=f"{corpus['docs_jsonl']},{corpus['code_jsonl']}",
                                      canonical_replicas=R, shuffle_buffer=4, chunk_size=32)
    dl = ZephonTextDataLoader(cfg, dp_world_size=1, dp_rank=0, tokenizer=tokenizer_path, seq_len=64,
                              local_batch_size=16)
    assert isinstance(dl, titan.BaseDataLoader)
    it = iter(dl)
    batches = [next(it) for _ in range(3)]
    inputs, labels = batches[0]
    assert inputs["input"].shape == labels.shape == inputs["positions"].shape == (16, 64)
    assert inputs["input"].dtype == labels.dtype == torch.long
    sd = dl.state_dict()
    assert set(sd) == {"dp_rank_0", "world_size"} and sd["dp_rank_0"].dtype == torch.uint8
    assert int(sd["world_size"]) == 1 and json.loads(sd["dp_rank_0"].numpy().tobytes())["dp_rank"] == 0
    again = ZephonTextDataLoader(cfg, dp_world_size=2, dp_rank=1, tokenizer=tokenizer_path, seq_len=64,
                                 local_batch_size=8)
    again.load_state_dict(sd)
    nxt, _ = next(iter(again))
    expected = next(it)[0]["input"]
    assert torch.equal(nxt["input"], expected[8:])  # rank 1 of dp 2 = second half of dp 1's batch
    with pytest.raises(CheckpointError, match="not saved by ZephonTextDataLoader"):
        again.load_state_dict({"dp_rank_0": b"x"})
    with pytest.raises(CheckpointError, match="lacks 'dp_rank_1'.*prepare_load"):
        again.load_state_dict({"dp_rank_0": sd["dp_rank_0"], "world_size": torch.tensor(2)})
    again.load_state_dict({})  # empty is a fresh start, as in torchtitan


@pytest.mark.contract("torchtitan.loader")
def test_torchtitan_labels_are_shifted_within_documents(corpus, tokenizer_path):
    pytest.importorskip("torchtitan.components.dataloader", reason="torchtitan not installed")
    from zephon_torch.titan import ZephonTextDataLoader

    cfg = ZephonTextDataLoader.Config(dataset_path=corpus["docs_jsonl"], canonical_replicas=R, shuffle_buffer=0,
                                      chunk_size=32)
    dl = ZephonTextDataLoader(cfg, dp_world_size=1, dp_rank=0, tokenizer=tokenizer_path, seq_len=64,
                              local_batch_size=8)
    inputs, labels = next(iter(dl))
    x, pos = inputs["input"], inputs["positions"]
    for i in range(x.shape[0]):
        for t in range(63):
            if labels[i, t] != -100:
                assert labels[i, t] == x[i, t + 1] and pos[i, t + 1] == pos[i, t] + 1
            elif pos[i, t + 1] != 0:  # -100 only where the next position starts a document (or pads)
                assert (x[i, t + 1:] == 0).all()


@pytest.mark.contract("torchtitan.loader")
def test_torchtitan_concat_packing_fills_every_row_with_shifted_labels(corpus, tokenizer_path):
    """``Config.packing="concat"``: windows of seq_len + 1 tokens overlapping by one (Megatron's), so no padding,
    and each label is the next token of the stream (the row after's first input for the last one), -100 only
    where a document starts; a dp 2 rank resumes on the second half of the dp 1 batch."""
    pytest.importorskip("torchtitan.components.dataloader", reason="torchtitan not installed")
    from zephon_torch.titan import ZephonTextDataLoader

    cfg = ZephonTextDataLoader.Config(dataset_path=corpus["docs_jsonl"], canonical_replicas=R, shuffle_buffer=0,
                                      chunk_size=32, packing="concat")
    dl = ZephonTextDataLoader(cfg, dp_world_size=1, dp_rank=0, tokenizer=tokenizer_path, seq_len=64,
                              local_batch_size=8)
    it = iter(dl)
    (inputs, labels), sd = next(it), dl.state_dict()
    x, pos = inputs["input"], inputs["positions"]
    assert x.shape == labels.shape == (8, 64) and (x != 0).all()  # <pad> is id 0: no padding anywhere
    rows_per_lane = 8 // R
    for i in range(8):
        nxt_first = x[i + 1, 0] if (i + 1) % rows_per_lane else None  # a lane's rows are consecutive
        for t in range(64):
            target = x[i, t + 1] if t < 63 else nxt_first
            if labels[i, t] != -100:
                assert target is None or labels[i, t] == target
                assert t == 63 or pos[i, t + 1] == pos[i, t] + 1
            else:  # the next token starts a document (at t = 63 the next row's start, not seen here)
                assert t == 63 or pos[i, t + 1] == 0
    again = ZephonTextDataLoader(cfg, dp_world_size=2, dp_rank=1, tokenizer=tokenizer_path, seq_len=64,
                                 local_batch_size=4)
    again.load_state_dict(sd)
    assert torch.equal(next(iter(again))[0]["input"], next(it)[0]["input"][4:])


@pytest.mark.contract("torch.finite")
@pytest.mark.parametrize("num_workers", [0, 3])
def test_finite_stream_ends_at_the_single_rank_step(corpus, tokenizer_path, tmp_path, num_workers):
    """exhaustion="stop": workers' lanes run out at different steps; the rank stops at the first step
    not every lane completes, as one uninterrupted core Loader does."""
    small = small_corpus(corpus, tmp_path)
    h = StepHasher()
    L = make_loader(small, tokenizer_path, exhaustion="stop")
    for mb in L:
        h.add(mb)
    L.close()
    ref = h.digests()
    assert 5 < len(ref) < 60
    dl = zephon_torch.DataLoader(make_dataset(small, tokenizer_path, dp=1, rank=0, exhaustion="stop"),
                                 num_workers=num_workers)
    assert step_digests(consume(dl, 10_000, 2)) == ref
    # every row of the pass is either delivered or counted as dropped, as the core Loader counts them
    assert dl.dropped_rows == L.stats()["dropped_rows"] > 0


@pytest.mark.contract("torchtitan.loader")
def test_torchtitan_accepts_every_keyword_and_config_field_of_its_text_loader(corpus, tokenizer_path):
    """Oracle: the installed torchtitan's ``HuggingFaceTextDataLoader``: each of its keyword-only
    arguments and each field of its ``Config``, at torchtitan's default, builds a loader that yields."""
    import dataclasses

    hf = pytest.importorskip("torchtitan.hf_datasets.text_datasets").HuggingFaceTextDataLoader
    from zephon_torch.titan import ZephonTextDataLoader

    base = dict(dp_world_size=1, dp_rank=0, tokenizer=tokenizer_path, seq_len=32, local_batch_size=R)
    path = f"{corpus['docs_jsonl']}"
    ours_fields = {f.name for f in dataclasses.fields(ZephonTextDataLoader.Config)}
    for f in dataclasses.fields(hf.Config):
        assert f.name in ours_fields, f"torchtitan's Config field {f.name} is missing"
        if f.name in ("dataset", "dataset_path"):
            continue
        default = f.default_factory() if f.default is dataclasses.MISSING else f.default
        cfg = ZephonTextDataLoader.Config(dataset_path=path, canonical_replicas=R, chunk_size=16, **{f.name: default})
        inputs, _ = next(iter(ZephonTextDataLoader(cfg, **base)))
        assert inputs["input"].shape == (R, 32), f.name
    cfg = ZephonTextDataLoader.Config(dataset_path=path, canonical_replicas=R, chunk_size=16)
    for name, default in host_keywords(hf.__init__).items():
        if name not in base and name != "config":
            assert default is not REQUIRED, f"torchtitan requires {name}, which this check does not supply"
            inputs, _ = next(iter(ZephonTextDataLoader(cfg, **base, **{name: default})))
            assert inputs["input"].shape == (R, 32), name
    with pytest.raises(ValueError, match="persistent_workers=True is not supported"):
        ZephonTextDataLoader(ZephonTextDataLoader.Config(dataset_path=path, persistent_workers=True), **base)


# torch/torchdata defaults refused on purpose (docs/distributed.md): the dataset yields whole micro-batches.
REFUSED_LOADER_DEFAULTS = {"batch_size": "batch_size"}


@pytest.mark.contract("torch.stateful", "torch.dataloader")
@pytest.mark.parametrize("cls", ["DataLoader", "StatefulDataLoader"])
def test_every_keyword_of_the_installed_loader_is_accepted_at_its_default(dirs, tokenizer_path, cls):
    """Oracle: the installed torch ``DataLoader`` / torchdata ``StatefulDataLoader`` signatures: every
    keyword, spelled out at the host's default, builds a loader that yields micro-batches of the rank."""
    from torchdata.stateful_dataloader import StatefulDataLoader as TDL
    from torch.utils.data import DataLoader as TorchDL

    host = TorchDL if cls == "DataLoader" else TDL
    ours = getattr(zephon_torch, cls)
    assert issubclass(ours, host)
    for name, default in host_keywords(host.__init__).items():
        if name == "dataset":
            continue
        ds = make_dataset(dirs, tokenizer_path, dp=2, rank=1)
        if name in REFUSED_LOADER_DEFAULTS:
            with pytest.raises(ValueError, match=REFUSED_LOADER_DEFAULTS[name]):
                ours(ds, **{name: default})
            continue
        mb = next(iter(ours(ds, **{name: default})))
        assert mb["input_ids"].ndim == 2, name


@pytest.mark.contract("torchtitan.loader")
def test_torchtitan_loader_restores_a_0_2_0_dcp_checkpoint(corpus, tokenizer_path, tmp_path):
    """A DCP checkpoint as 0.2.0 wrote it (one merged ``dataloader.zephon_state`` tensor) restores through
    ``prepare_load`` + ``dcp.load``; the next batch is the uninterrupted loader's."""
    pytest.importorskip("torchtitan.components.dataloader", reason="torchtitan not installed")
    import torch.distributed.checkpoint as dcp

    from zephon.host import encode_state, state_capacity
    from zephon_torch.titan import STATE_KEY, ZephonTextDataLoader

    cfg = ZephonTextDataLoader.Config(dataset_path=corpus["docs_jsonl"], canonical_replicas=R, shuffle_buffer=4,
                                      chunk_size=32)
    dl = ZephonTextDataLoader(cfg, dp_world_size=1, dp_rank=0, tokenizer=tokenizer_path, seq_len=64,
                              local_batch_size=16)
    it = iter(dl)
    next(it), next(it)
    old = encode_state(dl.dataloader.state_dict(), state_capacity(dl.dataset.plan))  # 0.2.0's state_dict()
    dcp.save({"dataloader": {STATE_KEY: torch.frombuffer(bytearray(old), dtype=torch.uint8)}},
             checkpoint_id=str(tmp_path / "v020"))
    again = ZephonTextDataLoader(cfg, dp_world_size=2, dp_rank=0, tokenizer=tokenizer_path, seq_len=64,
                                 local_batch_size=8)
    assert again.prepare_load(str(tmp_path / "v020")) == [STATE_KEY]
    dcp.load({"dataloader": again}, checkpoint_id=str(tmp_path / "v020"))
    assert torch.equal(next(iter(again))[0]["input"], next(it)[0]["input"][:8])
    with pytest.raises(CheckpointError, match="no Zephon data loader state under 'model'"):
        again.prepare_load(str(tmp_path / "v020"), key="model")


def _zephon_threads() -> list:
    names = ("zephon-dispatch", "zephon-build", "zephon-worker")
    return [t for t in threading.enumerate() if t.name.startswith(names)]


def test_host_workers_read_ahead_by_default_and_leave_no_thread(dirs, tokenizer_path):
    """What a DataLoader worker runs (worker 0 of 2's items) reads ahead in a dispatcher thread by default, gives the
    same items as ``worker_runner="inline"`` (no thread), and an abandoned iteration's threads end."""
    ds = make_dataset(dirs, tokenizer_path, dp=1, rank=0)
    # an earlier test's abandoned loader may still sit in a reference cycle, its threads alive until a collection
    gc.collect()
    wait_until(lambda: not _zephon_threads(), 30, "the zephon threads of an earlier test's loader to end")
    inline = ds.session.worker_items(2, 0, runner="inline")
    ref = [next(inline)[0]["state"] for _ in range(12)]
    assert not _zephon_threads()  # inline computes in next(), on this thread
    inline.close()
    items = ds.session.worker_items(2, 0)  # the default, as in each DataLoader worker
    got = [next(items)[0]["state"] for _ in range(12)]
    assert got == ref
    assert {t.name for t in _zephon_threads()} >= {"zephon-dispatch", "zephon-build", "zephon-worker_0"}
    del items  # abandoned, not closed
    gc.collect()
    wait_until(lambda: not _zephon_threads(), 30, "the abandoned worker loader's threads to end")


def test_abandoned_dataloader_workers_exit(dirs, tokenizer_path):
    """Forked DataLoader workers running the default (threaded) worker runner exit promptly when their iterator is
    dropped mid-stream (torch joins them; a thread of theirs that blocked exit would hold them past the wait)."""
    psutil = pytest.importorskip("psutil")

    def children():
        return [p for p in psutil.Process().children(recursive=True) if p.status() != psutil.STATUS_ZOMBIE]

    base = len(children())
    dl = zephon_torch.DataLoader(make_dataset(dirs, tokenizer_path, dp=1, rank=0), num_workers=2)
    it = iter(dl)
    for _ in range(5):
        next(it)
    assert len(children()) >= base + 2  # the workers really were running
    del it
    gc.collect()
    # a hang bound, not a speed check (torch joins its workers within seconds; a loaded CI machine is slower)
    wait_until(lambda: len(children()) <= base, 120, "the DataLoader's worker processes to exit")
