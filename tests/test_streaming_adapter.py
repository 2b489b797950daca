"""zephon_streaming: the Mosaic StreamingDataset / Composer contract on Zephon's lanes.

Ranks are simulated in one process through RANK / WORLD_SIZE / LOCAL_WORLD_SIZE (read when a dataset
is built); cross-rank states travel through a shared directory (``aggregate_dir``). The oracle is a
single-rank, single-process iteration of the dataset, cut into global batches and hashed here.
"""
from __future__ import annotations

import hashlib
import itertools
import json
import os
import threading
from collections import Counter

import pytest

torch = pytest.importorskip("torch")

from torch.utils.data import DataLoader  # noqa: E402

from helpers import host_keywords, world, write_split_jsonl  # noqa: E402
from zephon.checkpoint import CheckpointError  # noqa: E402
from zephon_streaming import RefusedKeyword, Stream, StreamingDataLoader, StreamingDataset  # noqa: E402

GBS = 16          # global batch: 16 rows; 16 lanes by default (num_canonical_nodes = global batch)
CHUNK = 4


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    root = str(tmp_path_factory.mktemp("streaming"))
    return {"a": write_split_jsonl(root, "a", 3, 120, 0), "b": write_split_jsonl(root, "b", 2, 90, 10_000),
            "agg": os.path.join(root, "agg")}


def make(data, rank=0, size=1, **kw):
    kw.setdefault("local", data["a"])
    kw.setdefault("split", "train")
    kw.setdefault("batch_size", GBS // size)
    kw.setdefault("shuffle", True)
    kw.setdefault("shuffle_seed", 17)
    kw.setdefault("chunk_size", CHUNK)
    kw.setdefault("aggregate_dir", data["agg"])
    with world(rank, size):
        return StreamingDataset(**kw)


def sample_key(s):
    return (int(s["id"]), s["text"])


def batch_rows(batch):
    ids = batch["id"].tolist()
    return list(zip(ids, batch["text"]))


def digest(rows):
    return hashlib.sha256(json.dumps(rows).encode()).hexdigest()


def oracle(data, epochs=2, **kw):
    """Global batches per epoch from one rank iterated in this process, hashed by this test."""
    ds = make(data, **kw)
    out = []
    for _ in range(epochs):
        rows = [sample_key(s) for s in ds]
        assert len(rows) == len(ds)
        out.append([digest(rows[i:i + GBS]) for i in range(0, len(rows), GBS)])
    return out, ds


def run_ranks(dsets, steps, workers, loader_cls=DataLoader):
    """Iterate every simulated rank one batch per global step; returns (loaders, iterators, digests)."""
    dls = [(loader_cls(d, batch_size=d.batch_size, num_workers=workers) if workers or loader_cls is not DataLoader
            else DataLoader(d, batch_size=d.batch_size)) for d in dsets]
    its = [iter(dl) for dl in dls]
    return dls, its, take_steps(its, steps)


def take_steps(its, steps):
    out = []
    for _ in range(steps) if steps is not None else itertools.count():
        try:
            rows = [r for it in its for r in batch_rows(next(it))]
        except StopIteration:
            break
        out.append(digest(rows))
    return out


def gather_states(dsets, num_samples, from_beginning=True):
    """Composer calls state_dict on every rank at once: one thread per simulated rank."""
    res, errs = [None] * len(dsets), []

    def call(i):
        try:
            res[i] = dsets[i].state_dict(num_samples, from_beginning)
        except Exception as e:  # pragma: no cover - surfaced below
            errs.append(e)

    ts = [threading.Thread(target=call, args=(i,)) for i in range(len(dsets))]
    for t in ts:
        t.start()
    for t in ts:
        t.join(60)
    assert not errs, errs
    assert all(r == res[0] for r in res), "ranks disagree on the global state"
    return res[0]


# -- order and epochs ------------------------------------------------------------------------------
@pytest.mark.contract("streaming.epochs")
def test_repeated_runs_same_order_and_one_pass_multiset(data):
    (o1, _), (o2, _) = oracle(data), oracle(data)
    assert o1 == o2
    assert o1[0] != o1[1], "each __iter__ is the next epoch (a new shuffle)"
    ds = make(data)
    e0, e1 = [sample_key(s) for s in ds], [sample_key(s) for s in ds]
    # Mosaic's epoch: every sample at least once; the last global batch is filled with repeats (fewer than one)
    fill = ds.repeated_per_epoch
    assert 0 <= fill < GBS and (360 + fill) % GBS == 0 and ds.dropped_per_epoch == 0
    for ep in (e0, e1):
        ids = [i for i, _ in ep]
        assert len(ids) == len(ds) == 360 + fill and set(ids) == set(range(360))
        assert sorted(Counter(ids).values()) == [1] * (360 - fill) + [2] * fill
    assert e0 != e1 and e0[:GBS] != e1[:GBS]


@pytest.mark.contract("streaming.epochs")
@pytest.mark.parametrize("size", [2, 4])
def test_world_sizes_give_same_global_batches_and_equal_len(data, size):
    o, ds1 = oracle(data, epochs=1)
    dsets = [make(data, r, size) for r in range(size)]
    assert {len(d) for d in dsets} == {len(ds1) // size}
    _, its, got = run_ranks(dsets, None, 0)
    assert got == o[0]
    per_rank = [len(list(DataLoader(d, batch_size=d.batch_size))) for d in dsets]  # next epoch: counts only
    assert per_rank == [len(ds1) // GBS] * size


# -- resume ----------------------------------------------------------------------------------------
@pytest.mark.contract("streaming.resume", "streaming.dataloader")
@pytest.mark.parametrize("workers", [0, 2])
def test_mid_epoch_resume_continues_exactly(data, workers):
    o, _ = oracle(data)
    ds = make(data)
    _, its, got = run_ranks([ds], 5, workers)
    assert got == o[0][:5]
    state = json.loads(json.dumps(ds.state_dict(5 * GBS, True)))
    assert state["epoch"] == 0 and state["sample_in_epoch"] == 5 * GBS
    del its
    ds2 = make(data)
    ds2.load_state_dict(state)
    _, its2, rest = run_ranks([ds2], None, workers)
    assert rest == o[0][5:]
    _, _, nxt = run_ranks([ds2], None, workers)
    assert nxt == o[1], "the loaded state is used once: the next __iter__ is epoch 1"


@pytest.mark.contract("streaming.resume")
def test_end_of_epoch_checkpoint_does_not_replay(data):
    o, _ = oracle(data)
    ds = make(data)
    _, _, got = run_ranks([ds], None, 2)
    assert got == o[0]
    state = ds.state_dict(0, True)  # Composer after the epoch: sample_in_epoch 0 of the next epoch
    assert (state["epoch"], state["sample_in_epoch"], state["loader"]) == (1, 0, None)
    ds2 = make(data)
    ds2.load_state_dict(state)
    _, _, first = run_ranks([ds2], None, 0)
    assert first == o[1]


@pytest.fixture(scope="module")
def elastic_ckpt(data):
    """World size 4, plain DataLoader with 2 workers per rank, checkpoint after 7 global steps."""
    o, _ = oracle(data)
    dsets = [make(data, r, 4, run_id="elastic4") for r in range(4)]
    _, its, got = run_ranks(dsets, 7, 2)
    assert got == o[0][:7]
    state = gather_states(dsets, 7 * GBS)
    del its
    return o, json.loads(json.dumps(state))


@pytest.mark.contract("streaming.elastic", "streaming.dataloader")
@pytest.mark.parametrize("new_world,workers", [(1, 0), (1, 2), (2, 0), (2, 2), (8, 0), (8, 2)])
def test_elastic_resume_from_world_4(data, elastic_ckpt, new_world, workers):
    o, state = elastic_ckpt
    dsets = [make(data, r, new_world) for r in range(new_world)]
    for d in dsets:
        d.load_state_dict(state)
    _, _, rest = run_ranks(dsets, None, workers)
    assert rest == o[0][7:]
    assert len(rest) == len(dsets[0]) // dsets[0].batch_size - 7


@pytest.mark.contract("streaming.dataloader", "streaming.elastic")
def test_streaming_dataloader_exact_state_with_prefetch(data, elastic_ckpt):
    o, ref_state = elastic_ckpt
    dsets = [make(data, r, 4, run_id="sdl4") for r in range(4)]
    dls = [StreamingDataLoader(d, batch_size=d.batch_size, num_workers=2, prefetch_factor=4) for d in dsets]
    assert [len(dl) for dl in dls] == [len(o[0])] * 4
    its = [iter(dl) for dl in dls]
    assert take_steps(its, 7) == o[0][:7]
    states = [None] * 4
    ts = [threading.Thread(target=lambda i=i: states.__setitem__(i, dls[i].state_dict())) for i in range(4)]
    [t.start() for t in ts]
    [t.join(60) for t in ts]
    assert states[0]["sample_in_epoch"] == 7 * GBS and all(s == states[0] for s in states)
    # entries may differ from the plain loader's (a flush span's seal seen or not), the restore may not
    ds1 = make(data)
    ds1.load_state_dict(json.loads(json.dumps(states[0])))
    sdl = StreamingDataLoader(ds1, num_workers=2)
    assert take_steps([iter(sdl)], None) == o[0][7:]
    assert take_steps([iter(sdl)], None) == o[1]


# -- Composer-shaped loop --------------------------------------------------------------------------
def _features(batch):
    ids = batch["id"].float()
    return torch.stack([torch.sin(ids), torch.cos(ids), (ids % 7) / 7, (ids % 5) / 5], 1), (ids % 3).long()


def composer_fit(data, ckpt=None, stop_at=None, epochs=2):
    """Composer's calls: load_state_dict when the dataloader is set, islice(dataloader, len) per epoch,
    state_dict(timestamp.sample_in_epoch, True) at a checkpoint, sample_in_epoch 0 after an epoch."""
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 3)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    ds = make(data)
    dl = DataLoader(ds, batch_size=ds.batch_size, num_workers=2)
    epoch, batch_in_epoch, seen = 0, 0, []
    if ckpt is not None:
        model.load_state_dict({k: torch.tensor(v) for k, v in ckpt["model"].items()})
        opt.load_state_dict(ckpt["optim"]) if ckpt.get("optim") else None
        epoch, batch_in_epoch = ckpt["epoch"], ckpt["batch_in_epoch"]
        ds.load_state_dict(ckpt["dataset_state"]["train"])
    saved = None
    while epoch < epochs:
        for batch in itertools.islice(dl, len(dl)):
            x, y = _features(batch)
            opt.zero_grad()
            torch.nn.functional.cross_entropy(model(x), y).backward()
            opt.step()
            seen.append(digest(batch_rows(batch)))
            batch_in_epoch += 1
            if stop_at == (epoch, batch_in_epoch):
                saved = {"model": {k: v.tolist() for k, v in model.state_dict().items()}, "epoch": epoch,
                         "batch_in_epoch": batch_in_epoch,
                         "dataset_state": {"train": ds.state_dict(batch_in_epoch * GBS, True)}}
                return seen, json.loads(json.dumps(saved)), model
        epoch, batch_in_epoch = epoch + 1, 0
        if stop_at == (epoch, 0):
            saved = {"model": {k: v.tolist() for k, v in model.state_dict().items()}, "epoch": epoch,
                     "batch_in_epoch": 0, "dataset_state": {"train": ds.state_dict(0, True)}}
            return seen, json.loads(json.dumps(saved)), model
    return seen, saved, model


@pytest.mark.contract("streaming.resume", "streaming.epochs")
@pytest.mark.parametrize("stop_at", [(0, 9), (1, 0)], ids=["mid-epoch", "epoch-end"])
def test_composer_shaped_loop_resumes_with_identical_batches(data, stop_at):
    full, _, m_full = composer_fit(data)
    head, ckpt, _ = composer_fit(data, stop_at=stop_at)
    tail, _, m_res = composer_fit(data, ckpt=ckpt)
    assert head + tail == full
    assert len(full) == 2 * (len(make(data)) // GBS)
    # SGD has no optimizer state: the weights must match exactly
    for a, b in zip(m_full.parameters(), m_res.parameters()):
        assert torch.equal(a, b)


# -- keywords, mixture, text pipeline --------------------------------------------------------------
@pytest.mark.contract("streaming.keywords")
@pytest.mark.parametrize("kw,fragment", [
    ({"sampling_method": "fixed"}, "sampling_method='fixed'"),
    ({"sampling_granularity": 4}, "sampling_granularity=4"),
    ({"partition_algo": "orig"}, "partition_algo='orig'"),
    ({"shuffle_algo": "py1s"}, "one shuffle"),
    ({"batching_method": "per_batch"}, "Invalid batching method: 'per_batch'"),
    ({"stream_name": "custom"}, "stream_name='custom'"),
    ({"batch_size": None}, "batch_size x world_size"),
    ({"remote": "oci://bucket/x", "local": "/nonexistent-zephon"}, "not read by Zephon"),
    ({"validate_hash": "sha1"}, "MDS shards only"),
    ({"num_canonical_nodes": 6}, "multiple of every world size"),
])
def test_refused_keywords_say_why_and_what_to_use(data, kw, fragment):
    with pytest.raises((RefusedKeyword, ValueError)) as e:
        make(data, 0, 4 if kw.get("num_canonical_nodes") else 1, **kw)
    assert fragment in str(e.value)


@pytest.mark.contract("streaming.state_dict")
def test_state_is_json_and_other_config_is_refused(data):
    ds = make(data)
    it = iter(DataLoader(ds, batch_size=GBS))
    next(it), next(it)
    state = ds.state_dict(2 * GBS, True)
    state = json.loads(json.dumps(state))
    assert len(json.dumps(state)) < 8192
    with pytest.raises(CheckpointError, match="shuffle_seed: state has 17, this dataset has 18"):
        make(data, shuffle_seed=18).load_state_dict(state)
    with pytest.raises(CheckpointError, match="global batch size: state has 16, this run has 32"):
        make(data, batch_size=32).load_state_dict(state)
    with pytest.raises(CheckpointError, match="chunk_size: checkpoint has 4, this loader has 8"):
        make(data, chunk_size=8).load_state_dict(state)
    with pytest.raises(CheckpointError, match="num_canonical_nodes: state has 16, this dataset has 8"):
        make(data, num_canonical_nodes=8).load_state_dict(state)
    with pytest.raises(CheckpointError) as e:  # the seed per epoch is derived from shuffle: shuffle is named first
        make(data, shuffle=False).load_state_dict(state)
    shuffle = "work.shuffle: checkpoint has True, this loader has False"
    assert shuffle in str(e.value) and str(e.value).index(shuffle) < str(e.value).index("work.seed")
    with pytest.raises(CheckpointError, match="mosaicml-streaming state"):
        make(data).load_state_dict({"epoch": 0, "sample_in_epoch": 32, "num_canonical_nodes": 1, "shuffle_seed": 1})
    with pytest.raises(CheckpointError, match="altered or truncated"):
        loader = json.loads(state["loader"])  # the lanes' checkpoint, as JSON text (one leaf for DCP)
        loader["lanes"][0]["delivered_rows"] += 1
        make(data).load_state_dict(dict(state, loader=json.dumps(loader)))
    with pytest.raises(CheckpointError, match="'loader' is not JSON"):
        make(data).load_state_dict(dict(state, loader=state["loader"][:-1]))
    legacy = dict(state, loader=json.loads(state["loader"]))  # as earlier versions wrote it: still restores
    make(data).load_state_dict(legacy)
    with pytest.raises(ValueError, match="not a whole number of global batches"):
        ds.state_dict(GBS + 1, True)


@pytest.mark.contract("streaming.mixture")
def test_stream_weights_map_to_the_mixture(data):
    ds = make(data, streams=[Stream(local=data["a"], proportion=3), Stream(local=data["b"], proportion=1)],
              local=None, epoch_size=320)
    assert len(ds) == 320 and ds.dropped_per_epoch == 0
    ids = [int(s["id"]) for s in ds]
    from_b = sum(i >= 10_000 for i in ids)
    assert abs(from_b - 80) <= 2 * ds.num_canonical_nodes * CHUNK // 8  # 1/4 of the epoch, within lane tails
    rep = make(data, streams=[Stream(local=data["b"], repeat=2)], local=None)
    ids = [int(s["id"]) for s in rep]
    # two passes of 180 samples, cut at 22 whole global batches: lane tails shift a few draws
    assert len(ids) == 352 and len(set(ids)) == 180 and max(ids.count(i) for i in set(ids)) <= 3
    assert sum(ids.count(i) == 2 for i in set(ids)) > 135
    ch = make(data, streams=[Stream(local=data["a"], choose=64), Stream(local=data["b"], choose=32)], local=None)
    assert len(ch) == 96
    with pytest.raises(ValueError, match="at most one of proportion, repeat and choose"):
        Stream(local=data["a"], proportion=1, repeat=2)
    with pytest.raises(ValueError, match="epoch_size cannot be combined"):
        make(data, streams=[Stream(local=data["a"], repeat=2)], local=None, epoch_size=100)


def test_text_pipeline_packs_rows_elastically(data, tokenizer_path):
    kw = dict(tokenizer=tokenizer_path, text_column="text", max_seq_len=32, eos_id=1, epoch_size=64, chunk_size=64)
    with pytest.raises(ValueError, match="needs epoch_size"):
        make(data, tokenizer=tokenizer_path)
    one = [s for s in make(data, **kw)]
    assert len(one) == 64 and set(one[0]) == {"input_ids", "labels", "position_ids", "attention_mask"}
    assert all(len(s["input_ids"]) == 32 for s in one)
    assert sum(int(s["attention_mask"].sum()) for s in one) > 0.85 * 64 * 32, "rows are packed"
    dsets = [make(data, r, 2, **kw) for r in range(2)]
    its = [iter(DataLoader(d, batch_size=d.batch_size)) for d in dsets]
    two = []
    for _ in range(64 // GBS):
        bs = [next(it) for it in its]
        two.extend(row.tolist() for b in bs for row in b["input_ids"])
    assert two == [s["input_ids"].tolist() for s in one]


def test_text_pipeline_concat_packing_fills_every_row(data, tokenizer_path):
    """``packing="concat"``: every row full (no padding in an epoch that ends before the data does), the rows'
    tokens the documents' tokens end to end, and two ranks give the same rows as one."""
    kw = dict(tokenizer=tokenizer_path, text_column="text", max_seq_len=32, eos_id=1, epoch_size=64, chunk_size=64,
              packing="concat")
    one = [s for s in make(data, **kw)]
    assert len(one) == 64 and all(int(s["attention_mask"].sum()) == 32 for s in one)
    dsets = [make(data, r, 2, **kw) for r in range(2)]
    its = [iter(DataLoader(d, batch_size=d.batch_size)) for d in dsets]
    two = [row.tolist() for _ in range(64 // GBS) for b in [next(it) for it in its] for row in b["input_ids"]]
    assert two == [s["input_ids"].tolist() for s in one]


@pytest.mark.contract("streaming.mds_format")
def test_mds_shards_written_by_mdswriter(tmp_path):
    from streaming import MDSWriter
    from streaming import StreamingDataset as MosaicDataset

    out = tmp_path / "mds"
    with MDSWriter(out=str(out / "train"), columns={"id": "int", "text": "str"}, compression="zstd",
                   hashes=["sha1", "xxh64"], size_limit=4096) as w:
        for i in range(200):
            w.write({"id": i, "text": f"mds sample {i}"})
    ds = make({"a": str(out), "agg": str(tmp_path / "agg")}, validate_hash="sha1")
    got = sorted((int(s["id"]), s["text"]) for s in ds)
    with world(0, 1):
        ref = MosaicDataset(local=str(out), split="train", batch_size=1)
        want = sorted((int(s["id"]), s["text"]) for s in ref)
    assert len(got) == len(ds) and set(got) <= set(want) and len(want) == 200


@pytest.mark.contract("streaming.mixture", "streaming.elastic")
def test_replication_gives_replica_ranks_identical_batches(data):
    o, _ = oracle(data, epochs=1)
    dsets = [make(data, r, 4, replication=2, batch_size=8, run_id="rep") for r in range(4)]
    its = [iter(DataLoader(d, batch_size=8)) for d in dsets]
    for step in range(3):
        bs = [batch_rows(next(it)) for it in its]
        assert bs[0] == bs[1] and bs[2] == bs[3] and bs[0] != bs[2]
        assert digest(bs[0] + bs[2]) == o[0][step]
    state = gather_states(dsets, 3 * GBS)
    ds1 = make(data)
    ds1.load_state_dict(state)
    assert take_steps([iter(DataLoader(ds1, batch_size=GBS))], None) == o[0][3:]


# -- the host's own signatures -------------------------------------------------------------------
# Host defaults Zephon refuses on purpose (docs/streaming.md), with the words its refusal must contain.
REFUSED_DEFAULTS = {"batch_size": "batch_size"}


@pytest.mark.contract("streaming.keywords")
def test_every_keyword_of_the_installed_streaming_dataset_is_accepted_at_its_default(data):
    """Oracle: the installed mosaicml-streaming's own ``StreamingDataset``/``Stream`` signatures. A config
    written for Mosaic that spells out a default (as llm-foundry YAMLs do) must build unchanged."""
    streaming = pytest.importorskip("streaming")
    host = host_keywords(streaming.StreamingDataset.__init__)
    ours = host_keywords(StreamingDataset.__init__)
    assert not set(host) - set(ours), f"keywords of streaming {streaming.__version__} missing here"
    differ = {k: (host[k], ours[k]) for k in host if ours[k] != host[k]}
    assert not differ, f"defaults that differ from streaming {streaming.__version__}'s (host, ours): {differ}"
    base = {"local": data["a"], "split": "train", "batch_size": GBS}
    for name, default in host.items():
        if name in ("local", "split", "remote", "streams"):
            continue  # where the data is: given by base
        kw = {**base, name: default}
        if name in REFUSED_DEFAULTS:
            with pytest.raises(RefusedKeyword, match=REFUSED_DEFAULTS[name]):
                make(data, **kw)
            continue
        ds = make(data, **kw)
        assert len(ds) > 0, name
    s_host = host_keywords(streaming.Stream.__init__)
    assert not set(s_host) - set(host_keywords(Stream.__init__))
    for name, default in s_host.items():
        if name not in ("local", "split", "remote"):
            ds = make(data, streams=[Stream(local=data["a"], split="train", **{name: default})], local=None,
                      split=None)
            assert len(ds) > 0, name


@pytest.mark.contract("streaming.mixture")
def test_stream_mixture_counts_match_mosaics_own(tmp_path):
    """Oracle: mosaicml-streaming's StreamingDataset over the same MDSWriter shards with the same Streams:
    one epoch's samples per stream. Zephon cuts epochs at whole global batches and lane chunks, so its
    counts may trail Mosaic's by at most the documented lane-tail bound (lanes x chunk_size)."""
    from streaming import MDSWriter
    from streaming import Stream as MosaicStream
    from streaming import StreamingDataset as MosaicDataset

    dirs = {}
    for name, n, off in (("a", 360, 0), ("b", 180, 10_000)):
        with MDSWriter(out=str(tmp_path / name), columns={"id": "int", "text": "str"}, size_limit=4096) as w:
            for i in range(n):
                w.write({"id": off + i, "text": f"{name} {i}"})
        dirs[name] = str(tmp_path / name)
    agg = str(tmp_path / "agg")
    bound = GBS * CHUNK  # lanes (num_canonical_nodes = global batch) x chunk_size
    for label, kws, extra in (("proportion", ({"proportion": 3}, {"proportion": 1}), {"epoch_size": 320}),
                              ("repeat", ({"repeat": 2}, {"repeat": 1}), {}),
                              ("choose", ({"choose": 64}, {"choose": 32}), {})):
        with world(0, 1):
            theirs = MosaicDataset(streams=[MosaicStream(local=dirs[n], **k) for n, k in zip("ab", kws)],
                                   batch_size=GBS, shuffle=True, shuffle_seed=17, **extra)
            want = Counter(int(s["id"]) >= 10_000 for s in theirs)
        ours = make({"a": None, "agg": agg}, streams=[Stream(local=dirs[n], **k) for n, k in zip("ab", kws)],
                    local=None, split=None, run_id=label, **extra)
        got = Counter(int(s["id"]) >= 10_000 for s in ours)
        for stream in (False, True):
            assert 0 <= want[stream] - got[stream] <= bound, (label, stream, want, got)


@pytest.mark.contract("streaming.keywords")
def test_honoured_shuffle_keywords_change_the_order_as_documented(data):
    """``shuffle``, ``shuffle_seed`` and ``shuffle_block_size`` are honoured (docs/streaming.md): each
    changes the epoch's order; the samples stay the dataset's, every one of them (and the fill repeats)."""
    def order(**kw):
        ds = make(data, run_id=str(sorted(kw.items())), **kw)
        return [sample_key(s) for s in ds], ds.dropped_per_epoch

    base, drop = order(shuffle=True, shuffle_seed=17)
    assert drop == 0
    assert order(shuffle=True, shuffle_seed=17)[0] == base
    for kw in ({"shuffle": False}, {"shuffle": True, "shuffle_seed": 18},
               {"shuffle": True, "shuffle_seed": 17, "shuffle_block_size": 8}):
        other, _ = order(**kw)
        assert other != base and len(other) == len(base), kw
        assert set(other) == set(base) and len(set(base)) == 360, kw


def test_unsafe_mds_column_names_streaming_datasets_own_keyword(data, tmp_path):
    """An MDS pkl column is refused naming StreamingDataset's allow_unsafe_types=True (the refusal said "to
    open_dataset", which the user never called); with the keyword the samples written here read back."""
    from streaming import MDSWriter
    from zephon.formats import UnsafeDataError
    d = str(tmp_path / "pkl")
    with MDSWriter(out=d, columns={"text": "str", "meta": "pkl"}) as w:
        for i in range(8):
            w.write({"text": f"doc {i}", "meta": {"i": i}})
    with pytest.raises(UnsafeDataError) as e:
        make(data, local=d, split=None, batch_size=2, num_canonical_nodes=2, chunk_size=2)
    msg = str(e.value)
    assert "'meta' uses the unsafe encoding 'pkl'" in msg and "index.json" in msg
    assert "pass allow_unsafe_types=True to StreamingDataset" in msg and "open_dataset" not in msg
    ds = make(data, local=d, split=None, batch_size=2, num_canonical_nodes=2, chunk_size=2, allow_unsafe_types=True)
    assert sorted(s["meta"]["i"] for s in itertools.islice(iter(ds), 8)) == list(range(8))
