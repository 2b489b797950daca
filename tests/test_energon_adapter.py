"""zephon_energon: Energon's API on Zephon lanes, checked against megatron-energon 7.4 itself.

Datasets are written with the real ``webdataset.ShardWriter`` and prepared with Energon's own prepare API
(the code behind ``energon prepare``). Oracles: megatron-energon's loader for sample content; an
uninterrupted single-rank run (no workers) for resumed and elastic runs; the split's sample count and
keys for "every sample once per pass".
"""
from __future__ import annotations

import io
import os
import time
from collections import Counter

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("megatron.energon")
wds = pytest.importorskip("webdataset")

from megatron import energon as me  # noqa: E402
from megatron.energon.epathlib import EPath  # noqa: E402
from megatron.energon.flavors.webdataset.base_webdataset import BaseWebdatasetFactory  # noqa: E402

import zephon_energon as ze  # noqa: E402
from helpers import REQUIRED, host_keywords  # noqa: E402
from zephon.checkpoint import CheckpointError  # noqa: E402


R = 8  # canonical_replicas in these tests (world sizes 1, 2, 4, 8)
TEXT_YAML = ("__module__: megatron.energon\n__class__: StandardWebdatasetFactory\nfield_map:\n  text: txt\n"
             "sample_type:\n  __module__: megatron.energon\n  __class__: TextSample\nsubflavors:\n  src: txt\n")
CAP_YAML = ("__module__: megatron.energon\n__class__: StandardWebdatasetFactory\nfield_map:\n  image: png\n"
            "  caption: json[caption]\nsample_type:\n  __module__: megatron.energon\n  __class__: CaptioningSample\n")


def _prepare(root, paths, yaml_text, exclude=()):
    BaseWebdatasetFactory.prepare_dataset(EPath(root), paths, split_parts_patterns=[
        ("train", r"data-00[0-2]\.tar"), ("val", r"data-003\.tar")], shuffle_seed=None, workers=1)
    meta = os.path.join(root, ".nv-meta")
    with open(os.path.join(meta, "dataset.yaml"), "w") as fh:
        fh.write(yaml_text)
    if exclude:
        split = open(os.path.join(meta, "split.yaml")).read().replace("exclude: []", "exclude:\n" + "".join(
            f"- {e}\n" for e in exclude))
        with open(os.path.join(meta, "split.yaml"), "w") as fh:
            fh.write(split)


def _text(i):
    return f"sample {i} " + "abcdefghij"[: i % 11] * (1 + i % 5)


@pytest.fixture(scope="module")
def text_ds(tmp_path_factory):
    """200 text samples in 4 tars of 50; train = tars 0-2 minus one excluded key, val = tar 3."""
    root = tmp_path_factory.mktemp("energon_text")
    with wds.ShardWriter(str(root / "data-%03d.tar"), maxcount=50, verbose=0) as w:
        for i in range(200):
            w.write({"__key__": f"s{i:05d}", "txt": _text(i)})
    _prepare(str(root), sorted(p.name for p in root.glob("*.tar")), TEXT_YAML, exclude=["data-001.tar/s00060"])
    return str(root)


@pytest.fixture(scope="module")
def cap_ds(tmp_path_factory):
    from PIL import Image
    import numpy as np

    root = tmp_path_factory.mktemp("energon_cap")
    rng = np.random.default_rng(0)
    with wds.ShardWriter(str(root / "data-%03d.tar"), maxcount=6, verbose=0) as w:
        for i in range(24):
            buf = io.BytesIO()
            Image.fromarray(rng.integers(0, 255, (6, 5, 3), dtype=np.uint8)).save(buf, format="PNG")
            w.write({"__key__": f"c{i:04d}", "png": buf.getvalue(), "json": {"caption": f"caption {i}", "i": i}})
    _prepare(str(root), sorted(p.name for p in root.glob("*.tar")), CAP_YAML)
    return str(root)


def wc(rank=0, world=1, workers=0, **kw):
    return ze.WorkerConfig(rank=rank, world_size=world, num_workers=workers, **kw)


def train_loader(path, rank=0, world=1, workers=0, batch_size=2, **kw):
    kw.setdefault("shuffle_buffer_size", 4)
    kw.setdefault("canonical_replicas", R)
    ds = ze.get_train_dataset(path, worker_config=wc(rank, world, workers), batch_size=batch_size,
                              max_samples_per_sequence=None, **kw)
    return ze.get_savable_loader(ds)


def take(dl, n, fn=lambda b: tuple(b.__key__)):
    out = []
    if n <= 0:
        return out
    for b in dl:
        out.append(fn(b))
        if len(out) == n:
            break
    return out


def energon_samples(path, split_part="train"):
    ds = me.get_train_dataset(path, split_part=split_part, worker_config=wc(), batch_size=None,
                              shuffle_buffer_size=None, max_samples_per_sequence=None, repeat=False)
    return {s.__key__: s for s in me.get_loader(ds)}


# -- content ---------------------------------------------------------------------------------------
@pytest.mark.contract("energon.format")
def test_text_samples_equal_energons_per_key_and_each_pass_is_the_split(text_ds):
    ref = energon_samples(text_ds)
    assert len(ref) == 149 and "s00060" not in ref  # 3 tars of 50, one excluded key
    dl = train_loader(text_ds, batch_size=None, repeat=False)
    for pass_ in range(2):  # after a finite pass ended, the next iter() starts it again
        mine = list(dl)
        keys = [s.__key__ for s in mine]
        assert Counter(keys) == Counter(ref.keys()), pass_  # exactly the split minus exclude, once each
        for s in mine:
            r = ref[s.__key__]
            assert type(s) is me.TextSample and s.text == r.text
            assert tuple(s.__restore_key__) == tuple(r.__restore_key__[-2:])  # ("Webdataset", index)
            assert s.__subflavors__ == r.__subflavors__ == {"src": "txt"}
            assert s.__sources__[0].shard_name == r.__sources__[0].shard_name


@pytest.mark.contract("energon.format")
def test_captioning_samples_equal_energons(cap_ds):
    ref = energon_samples(cap_ds)
    dl = train_loader(cap_ds, batch_size=None, repeat=False, canonical_replicas=2)
    mine = {s.__key__: s for s in dl}
    assert mine.keys() == ref.keys() and len(mine) == 18
    for k, s in mine.items():
        r = ref[k]
        assert type(s) is me.CaptioningSample and s.caption == r.caption
        assert s.image.dtype == r.image.dtype and torch.equal(s.image, r.image)


@pytest.mark.contract("energon.val")
def test_val_dataset_is_one_ordered_pass_split_over_ranks(text_ds):
    ref = energon_samples(text_ds, "val")
    got = []
    for rank in range(2):
        ds = ze.get_val_dataset(text_ds, worker_config=wc(rank, 2), batch_size=4, canonical_replicas=R)
        dl = ze.get_loader(ds)
        first = [k for b in dl for k in b.__key__]
        assert [k for b in dl for k in b.__key__] == first  # every iter() starts at the beginning
        got += first
    assert Counter(got) == Counter(ref.keys())


# -- resume ----------------------------------------------------------------------------------------
@pytest.mark.contract("energon.savable_loader", "energon.elastic")
def test_restored_stream_equals_continued_stream(text_ds, tmp_path):
    ref = take(train_loader(text_ds), 60)
    dl = train_loader(text_ds, workers=2)
    head = take(dl, 13)  # mid-step (4 lanes: 8 lanes per step at world 1)
    state = dl.save_state_rank()
    torch.save({"dataloader_state_dict": state}, tmp_path / "s.pt")
    loaded = torch.load(tmp_path / "s.pt", weights_only=True)["dataloader_state_dict"]
    assert loaded == state
    rest = take(dl, 20)
    assert head + rest == ref[:33]
    dl.close()
    again = train_loader(text_ds, workers=1)
    again.restore_state_rank(loaded)
    assert again.save_state_rank() == state  # a save immediately after a restore is that state
    resumed = train_loader(text_ds, workers=0)
    resumed.restore_state_rank(again.save_state_rank())
    assert take(resumed, 27) == ref[13:40]
    again.close()


@pytest.mark.contract("energon.savable_loader", "energon.elastic")
def test_virtual_epochs_resume_at_the_boundary(text_ds):
    ref = take(train_loader(text_ds), 30)
    dl = train_loader(text_ds, workers=2, virtual_epoch_length=10)
    assert len(dl) == 10
    e1 = [tuple(b.__key__) for b in dl]
    e2 = [tuple(b.__key__) for b in dl]
    state = dl.save_state_rank()  # exactly at an epoch boundary
    e3 = [tuple(b.__key__) for b in dl]
    assert e1 + e2 + e3 == ref
    dl.close()
    r = train_loader(text_ds, workers=1, virtual_epoch_length=10)
    r.restore_state_rank(state)
    assert [tuple(b.__key__) for b in r] == e3


@pytest.mark.contract("energon.savable_loader", "energon.elastic")
def test_finite_pass_end_state_restores_to_the_next_pass(text_ds):
    dl = train_loader(text_ds, batch_size=None, repeat=False, canonical_replicas=4)
    first = [s.__key__ for s in dl]
    state = dl.save_state_rank()  # the pass has ended
    second = [s.__key__ for s in dl]
    r = train_loader(text_ds, batch_size=None, repeat=False, canonical_replicas=4, workers=2)
    r.restore_state_rank(state)
    assert [s.__key__ for s in r] == second == first


# -- elastic ---------------------------------------------------------------------------------------
def _global_batches(per_rank, world, steps):
    """Per step: the ranks' lane batches in rank order (contiguous lanes: lane order)."""
    L = R // world
    return [[b for r in range(world) for b in per_rank[r][L * s:L * (s + 1)]] for s in range(steps)]


@pytest.mark.contract("energon.elastic", "energon.savable_loader")
@pytest.mark.parametrize("new_world,new_workers", [(1, 0), (1, 1), (2, 0), (2, 1), (8, 0), (8, 1)])
def test_elastic_restore_every_global_batch_equals_uninterrupted(text_ds, new_world, new_workers, elastic_save):
    ref, states, k = elastic_save
    m = 3
    runs = {}
    for r in range(new_world):
        dl = train_loader(text_ds, rank=r, world=new_world, workers=new_workers)
        dl.restore_state_global(states)  # Energon's list of rank states, from world size 4
        runs[r] = take(dl, (R // new_world) * m)
        dl.close()
    assert _global_batches(runs, new_world, m) == [ref[R * (k + s):R * (k + s + 1)] for s in range(m)]


@pytest.fixture(scope="module")
def elastic_save(text_ds):
    """World size 4 with 2 workers per rank, saved after k global steps (save_state_global semantics)."""
    k = 3
    ref = take(train_loader(text_ds), R * (k + 3))
    runs, states = {}, []
    for r in range(4):
        dl = train_loader(text_ds, rank=r, world=4, workers=2)
        runs[r] = take(dl, 2 * k)
        states.append(dl.save_state_global(0)[0])  # not distributed: [this rank's state]
        dl.close()
    assert _global_batches(runs, 4, k) == [ref[R * s:R * (s + 1)] for s in range(k)]
    return ref, states, k


# -- TaskEncoder with packing ----------------------------------------------------------------------
class PackingTE(ze.DefaultTaskEncoder):
    """Characters as tokens; first-fit packs of at most 48 tokens; batches pad-stacked."""

    CAP = 48

    @ze.stateless
    def encode_sample(self, s):
        if s.__key__.endswith("7"):
            raise ze.SkipSample()
        return {"key": s.__key__, "tokens": torch.tensor([ord(c) for c in s.text][: self.CAP])}

    def select_samples_to_pack(self, samples):
        bins = []
        for s in samples:
            for b in bins:
                if sum(len(x["tokens"]) for x in b) + len(s["tokens"]) <= self.CAP:
                    b.append(s)
                    break
            else:
                bins.append([s])
        return bins

    @ze.stateless
    def pack_selected_samples(self, samples):
        return {"keys": [s["key"] for s in samples], "tokens": torch.cat([s["tokens"] for s in samples])}

    @ze.stateless
    def batch(self, packs):
        return {"keys": [p["keys"] for p in packs], "tokens": ze.batch_pad_stack([p["tokens"] for p in packs])}

    @ze.stateless
    def encode_batch(self, b):
        return dict(b, lengths=[len(k) for k in b["keys"]])


def _pack_loader(path, **kw):
    return train_loader(path, task_encoder=PackingTE(), packing_buffer_size=6, **kw)


@pytest.mark.contract("energon.task_encoder")
def test_packing_task_encoder_packs_every_sample_once_per_pass(text_ds):
    ref = energon_samples(text_ds)
    dl = _pack_loader(text_ds, repeat=False, batch_size=3)
    keys = []
    for b in dl:
        assert b["tokens"].shape[0] <= 3 and b["tokens"].shape[1] <= PackingTE.CAP
        for pack_keys, row in zip(b["keys"], b["tokens"]):
            text = "".join(ref[k].text for k in pack_keys)[: row.shape[0]]
            assert "".join(chr(int(c)) for c in row[: len(text)]) == text  # pack = members, in order
            keys += pack_keys
    assert Counter(keys) == Counter(k for k in ref if not k.endswith("7"))  # SkipSample drops, counted


@pytest.mark.contract("energon.task_encoder", "energon.elastic")
def test_packing_is_deterministic_across_resume_and_world_size(text_ds):
    key = lambda b: tuple(tuple(k) for k in b["keys"])  # noqa: E731
    ref = take(_pack_loader(text_ds), 5 * R, key)
    states = []
    for r in range(2):
        dl = _pack_loader(text_ds, rank=r, world=2, workers=2)
        assert take(dl, 4 * 2, key) == [b for s in range(2) for b in ref[R * s + 4 * r:R * s + 4 * r + 4]]
        states.append(dl.save_state_rank())
        dl.close()
    dl = _pack_loader(text_ds, world=1, workers=1)
    dl.restore_state_global(states)
    assert take(dl, 3 * R, key) == ref[2 * R:]
    dl.close()


# -- TaskEncoder without packing ---------------------------------------------------------------------
class PlainTE(ze.DefaultTaskEncoder):
    """encode_sample -> dict, batch -> user dict with a tensor, encode_batch adds a field."""

    @ze.stateless
    def encode_sample(self, s):
        return {"key": s.__key__, "n": len(s.text), "up": s.text.upper()}

    def batch(self, samples):
        return {"keys": [s["key"] for s in samples], "n": torch.tensor([s["n"] for s in samples]),
                "up": [s["up"] for s in samples]}

    def encode_batch(self, b):
        return dict(b, total=int(b["n"].sum()))


@pytest.mark.contract("energon.task_encoder")
def test_plain_task_encoder_rows_equal_energons_run_of_the_same_encoder(text_ds):
    """Oracle: megatron.energon's own loader running the same TaskEncoder (its order differs, so rows are
    compared per key); each of our batches went through batch then encode_batch."""
    theirs = {}
    for b in me.get_loader(me.get_train_dataset(text_ds, worker_config=wc(), batch_size=2, shuffle_buffer_size=None,
                                                max_samples_per_sequence=None, repeat=False, task_encoder=PlainTE())):
        assert b["total"] == int(b["n"].sum())
        theirs.update({k: (int(n), u) for k, n, u in zip(b["keys"], b["n"], b["up"])})
    assert len(theirs) == 149
    keys = []
    for b in train_loader(text_ds, task_encoder=PlainTE(), batch_size=2, repeat=False):
        assert set(b) == {"keys", "n", "up", "total"} and b["total"] == int(b["n"].sum())
        assert 1 <= len(b["keys"]) <= 2  # batch_drop_last=False: a lane's last batch may be short, as in Energon
        for k, n, u in zip(b["keys"], b["n"], b["up"]):
            assert (int(n), u) == theirs[k], k
        keys += b["keys"]
    assert sorted(keys) == sorted(theirs)  # one pass: every sample once


# -- bad input -------------------------------------------------------------------------------------
def test_worker_and_rank_without_samples_do_not_hang(text_ds):
    ref = take(train_loader(text_ds, canonical_replicas=2), 10)
    dl = train_loader(text_ds, canonical_replicas=2, workers=3)  # worker 2 owns no lane
    t = time.monotonic()
    assert take(dl, 10) == ref
    dl.close()
    # val: 50 samples over 64 lanes (one each); rank 7 of 8 owns lanes 56-63 (contiguous), which hold none
    ds = ze.get_val_dataset(text_ds, worker_config=wc(7, 8, 2), batch_size=1, canonical_replicas=64,
                            lane_assignment="contiguous")
    assert list(ze.get_loader(ds)) == []
    # A hang bound, not a speed check: alone this takes ~5 s, under a loaded CI machine up to ~40 s.
    elapsed = time.monotonic() - t
    assert elapsed < 300, f"a worker or rank without samples waited {elapsed:.0f} s for data that never comes"


@pytest.mark.contract("energon.savable_loader")
def test_state_of_another_config_is_refused_naming_the_difference(text_ds):
    dl = train_loader(text_ds)
    take(dl, 3)
    state = dl.save_state_rank()
    with pytest.raises(CheckpointError, match="seed"):
        other = ze.get_savable_loader(ze.get_train_dataset(
            text_ds, worker_config=wc(seed_offset=1), batch_size=2, shuffle_buffer_size=4,
            max_samples_per_sequence=None, canonical_replicas=R))
        other.restore_state_rank(state)
    with pytest.raises(CheckpointError, match="drop_last"):
        train_loader(text_ds, batch_drop_last=True).restore_state_rank(state)
    with pytest.raises(CheckpointError, match="buffer_size"):
        train_loader(text_ds, shuffle_buffer_size=8).restore_state_rank(state)
    with pytest.raises(CheckpointError, match="canonical_replicas"):
        train_loader(text_ds, canonical_replicas=4).restore_state_rank(state)


@pytest.mark.contract("energon.savable_loader")
def test_partial_states_and_foreign_states_fail_loudly(text_ds, elastic_save):
    _ref, states, _k = elastic_save
    dl = train_loader(text_ds, rank=0, world=2)
    with pytest.raises(CheckpointError, match="lacks lanes"):
        dl.restore_state_rank(states[0])  # old rank 0 holds lanes 0-1; new rank 0 owns 0-3
    dl.restore_state_rank(states[:2])  # old ranks 0 and 1 hold lanes 0-3: enough
    energon_state = me.savable_loader.SavableDataLoaderState(worker_states=[], next_worker_id=0, micro_batch_size=2)
    with pytest.raises(CheckpointError, match="not a zephon_energon state"):
        dl.restore_state_rank(energon_state)


@pytest.mark.contract("energon.keywords")
def test_refused_keywords_say_why(text_ds):
    with pytest.raises(ze.RefusedKeyword, match="shuffle_over_epochs_multiplier"):
        train_loader(text_ds, shuffle_over_epochs_multiplier=-1)
    with pytest.raises(ze.RefusedKeyword, match="cache_pool"):
        train_loader(text_ds, cache_pool=object())
    with pytest.raises(ze.RefusedKeyword, match="parallel_shard_iters.*Zephon extras"):
        train_loader(text_ds, parallel_shard_iters=2)
    with pytest.raises(Exception, match="does not divide canonical_replicas"):
        train_loader(text_ds, world=3, rank=0)


# -- metadataset ---------------------------------------------------------------------------------
@pytest.mark.contract("energon.metadataset")
def test_metadataset_blend_samples_equal_energons(text_ds, cap_ds, tmp_path):
    meta = tmp_path / "blend.yaml"
    meta.write_text("__module__: megatron.energon\n__class__: MetadatasetV2\nsplits:\n  train:\n    blend:\n"
                    f"      - weight: 3\n        path: {text_ds}\n        subflavors:\n          kind: text\n"
                    f"      - weight: 1\n        path: {cap_ds}\n")
    ds = me.get_train_dataset(str(meta), worker_config=wc(), batch_size=None, shuffle_buffer_size=None,
                              max_samples_per_sequence=None)
    ref = {}
    for n, s in enumerate(me.get_loader(ds)):
        ref.setdefault(s.__key__, s)
        if len(ref) >= 149 + 18 or n > 20000:
            break
    dl = train_loader(str(meta), batch_size=None, canonical_replicas=2)
    mine = take(dl, 400, lambda s: s)
    kinds = Counter(type(s).__name__ for s in mine)
    assert abs(kinds["TextSample"] / 400 - 0.75) < 0.05  # blend weights 3:1
    for s in mine:
        r = ref[s.__key__]
        assert type(s) is type(r) and s.__subflavors__ == r.__subflavors__
        if isinstance(s, me.TextSample):
            assert s.text == r.text and s.__subflavors__.get("kind") == "text"
        else:
            assert s.caption == r.caption and torch.equal(s.image, r.image)


# -- Megatron-LM provider --------------------------------------------------------------------------
@pytest.mark.contract("energon.megatron")
def test_megatron_provider_resumes_at_another_world_size_and_fails_loudly(text_ds, tmp_path):
    from types import SimpleNamespace

    from zephon_energon import megatron as zm

    def args(**kw):
        base = dict(data_path=[text_ds], micro_batch_size=2, num_workers=0, load=None, dataloader_save=str(tmp_path),
                    iteration=0, eval_iters=2, packing_buffer_size=None, canonical_replicas=R)
        return SimpleNamespace(**dict(base, **kw))

    def batches(it, n):
        return [tuple(next(it).__key__) for _ in range(n)]

    trains = [zm.train_valid_test_dataloaders_provider(None, args=args(), dp_rank=r, dp_world_size=2)[0]
              for r in range(2)]
    head = [batches(t, 8) for t in trains]  # 2 global steps
    for r, t in enumerate(trains):  # what Megatron-LM's maybe_save_dataloader_state writes
        name = zm.checkpoint_name(str(tmp_path), 10, r)
        os.makedirs(os.path.dirname(name), exist_ok=True)
        torch.save({"dataloader_state_dict": t.save_state()}, name)
    cont = [batches(t, 4) for t in trains]
    train, valid, test = zm.train_valid_test_dataloaders_provider(None, args=args(load="x", iteration=10), dp_rank=0,
                                                                  dp_world_size=1)
    assert batches(train, 8) == cont[0] + cont[1]  # one step: rank 0's lanes then rank 1's
    assert len(valid) == 1 and len(batches(iter(valid[0]), 3)) == 3
    assert head[0] != head[1]
    with pytest.raises(FileNotFoundError, match="refusing"):
        zm.train_valid_test_dataloaders_provider(None, args=args(load="x", iteration=20), dp_rank=0, dp_world_size=1)
    with pytest.raises(CheckpointError, match="canonical_replicas"):
        zm.train_valid_test_dataloaders_provider(None, args=args(load="x", iteration=10, canonical_replicas=4),
                                                 dp_rank=0, dp_world_size=1)


# -- validation layout, limit, tiny datasets, virtual epochs, subflavors (oracle: Energon itself) ----------------
def _val_batches(lib, path, rank, world, workers, bs, loader="get_loader", **kw):
    ds = lib.get_val_dataset(path, worker_config=lib.WorkerConfig(rank=rank, world_size=world, num_workers=workers),
                             batch_size=bs, **kw)
    dl = getattr(lib, loader)(ds)
    return dl, [list(b.__key__) for b in dl]


@pytest.mark.contract("energon.val", "energon.savable_loader")
def test_savable_loader_honours_val_limit_like_energon(text_ds):
    for world, workers in [(1, 0), (2, 2)]:
        for r in range(world):
            edl, ref = _val_batches(me, text_ds, r, world, workers, 4, "get_savable_loader", limit=3)
            zdl, got = _val_batches(ze, text_ds, r, world, workers, 4, "get_savable_loader", limit=3)
            assert len(zdl) == len(edl) == 3 and len(got) == len(ref) == 3
            assert [len(b) for b in got] == [len(b) for b in ref] == [4, 4, 4]
            assert [list(b.__key__) for b in zdl] == got  # each iter() starts the split again
            if world == 1:
                assert got == ref  # one lane: the stored order, as Energon's one slice
            zdl.close()
    # an interrupted limited epoch resumes its remainder, then the split starts again (LimitDataset's offset)
    zdl, full = _val_batches(ze, text_ds, 0, 1, 0, 4, "get_savable_loader", limit=3)
    it = iter(zdl)
    assert list(next(it).__key__) == full[0]
    state = zdl.save_state_rank()
    again = ze.get_savable_loader(ze.get_val_dataset(text_ds, worker_config=wc(), batch_size=4, limit=3))
    again.restore_state_rank(state)
    assert [list(b.__key__) for b in again] == full[1:]
    assert [list(b.__key__) for b in again] == full


@pytest.mark.contract("energon.val")
@pytest.mark.parametrize("world,workers,bs", [(4, 2, 5), (2, 0, 4), (2, 3, 3)])
def test_val_batches_are_full_and_rank_counts_match_energon(text_ds, world, workers, bs):
    """50 val samples: Energon splits them into world_size x num_workers near-equal slices; Zephon's default
    validation lanes (one per rank-worker) give the same batch counts per rank and the same batch sizes,
    every sample once (a per-batch collective in an eval loop cannot hang)."""
    ref, got = [], []
    for r in range(world):
        ref.append(_val_batches(me, text_ds, r, world, workers, bs)[1])
        got.append(_val_batches(ze, text_ds, r, world, workers, bs)[1])
    assert [len(x) for x in got] == [len(x) for x in ref]
    assert sorted(len(b) for x in got for b in x) == sorted(len(b) for x in ref for b in x)
    assert sorted(k for x in got for b in x for k in b) == sorted(k for x in ref for b in x for k in b)


def test_dataset_smaller_than_the_lanes_is_refused_or_warned(text_ds):
    n = len(energon_samples(text_ds))  # 149 train samples; 256 lanes
    with pytest.raises(ValueError, match=rf"{n} samples per pass for canonical_replicas=256.*ranks \[3\].*"
                                         rf"canonical_replicas .*at most {n}"):
        train_loader(text_ds, rank=0, world=4, repeat=False, canonical_replicas=256)
    with pytest.warns(ze.ZephonEnergonWarning, match=rf"{n} samples per pass for canonical_replicas=256.*twice"):
        train_loader(text_ds, rank=0, world=4, repeat=True, canonical_replicas=256)
    with pytest.warns(ze.ZephonEnergonWarning, match="no sample, so ranks get unequal"):
        train_loader(text_ds, world=1, repeat=False, canonical_replicas=256)
    with pytest.warns(ze.ZephonEnergonWarning, match="fewer than batch_size=5: every batch is short"):
        ze.get_val_dataset(text_ds, worker_config=wc(), batch_size=5, canonical_replicas=64)


def _vel_run(lib, path, cut):
    """Two virtual epochs of 7, ``cut`` batches of the third, save, restore in a new loader: the batches
    of its next two iter()s."""
    def make():
        ds = lib.get_train_dataset(path, worker_config=lib.WorkerConfig(rank=0, world_size=1, num_workers=1),
                                   batch_size=3, shuffle_buffer_size=4, max_samples_per_sequence=None,
                                   virtual_epoch_length=7, **({} if lib is me else {"canonical_replicas": R}))
        return lib.get_savable_loader(ds)
    dl = make()
    head = [[tuple(b.__key__) for b in dl] for _ in range(2)]
    it = iter(dl)
    head.append([tuple(next(it).__key__) for _ in range(cut)])
    state = dl.save_state_rank()
    del it
    dl2 = make()
    dl2.restore_state_rank(state)
    return head, [[tuple(b.__key__) for b in dl2] for _ in range(2)]


@pytest.mark.contract("energon.savable_loader")
def test_virtual_epoch_interrupted_resumes_its_remainder_like_energon(text_ds):
    ref_head, ref_tail = _vel_run(me, text_ds, 3)
    head, tail = _vel_run(ze, text_ds, 3)
    assert [len(e) for e in head] == [len(e) for e in ref_head] == [7, 7, 3]
    assert [len(e) for e in tail] == [len(e) for e in ref_tail] == [4, 7]
    uninterrupted = take(train_loader(text_ds, workers=1, batch_size=3), 7 * 4)
    assert [b for e in head + tail for b in e] == uninterrupted
    # rank states of a world of 2 (a list, as save_state_global gives): each rank keeps its own offset
    states = []
    for r in range(2):
        dl = train_loader(text_ds, rank=r, world=2, virtual_epoch_length=5)
        [b for b in dl]
        take(dl, 2 + r)
        states.append(dl.save_state_rank())
    assert [s["epoch_offset"] for s in states] == [2, 3]
    for r in range(2):
        dl = train_loader(text_ds, rank=r, world=2, workers=1, virtual_epoch_length=5)
        dl.restore_state_global(states)
        assert dl.save_state_rank()["epoch_offset"] == 2 + r
        assert len(list(dl)) == 3 - r and len(list(dl)) == 5


@pytest.mark.contract("energon.keywords")
def test_subflavors_keyword_merges_like_energon(text_ds, tmp_path):
    def first(lib, path, fn="get_train_dataset", **kw):
        w = lib.WorkerConfig(rank=0, world_size=1, num_workers=0)
        if fn == "get_train_dataset":
            ds = lib.get_train_dataset(path, worker_config=w, batch_size=None, shuffle_buffer_size=None,
                                       max_samples_per_sequence=None, **kw)
        else:
            ds = lib.get_val_datasets(path, worker_config=w, batch_size=None, **kw)[0][0]
        return next(iter(lib.get_loader(ds))).__subflavors__

    kw = {"subflavors": {"src": "keyword", "extra": 1}}
    assert first(ze, text_ds, **kw) == first(me, text_ds, **kw) == {"src": "keyword", "extra": 1}
    meta = tmp_path / "meta.yaml"
    meta.write_text("__module__: megatron.energon\n__class__: MetadatasetV2\nsplits:\n"
                    f"  train:\n    path: {text_ds}\n    subflavors:\n      kind: text\n      extra: 0\n"
                    f"  val:\n    path: {text_ds}\n    subflavors:\n      kind: val\n")
    assert first(ze, str(meta), **kw) == first(me, str(meta), **kw)
    assert first(ze, str(meta)) == first(me, str(meta))
    assert first(ze, str(meta), "get_val_datasets") == first(me, str(meta), "get_val_datasets") \
        == {"src": "txt", "kind": "val"}
    assert first(ze, str(meta), "get_val_datasets", **kw) == first(me, str(meta), "get_val_datasets", **kw)


# -- the host's own signatures -------------------------------------------------------------------


@pytest.mark.contract("energon.keywords")
@pytest.mark.parametrize("fn", ["get_train_dataset", "get_val_dataset", "get_loader", "get_savable_loader"])
def test_every_keyword_of_the_installed_energon_is_accepted_at_its_default(text_ds, fn):
    """Oracle: the installed megatron-energon's own signatures. Every keyword it has exists here, and a
    call spelling out any one of its defaults builds and yields (Megatron-LM passes most explicitly)."""
    host = host_keywords(getattr(me, fn))
    assert not set(host) - set(host_keywords(getattr(ze, fn))), f"{fn}: keywords of this Energon missing"
    required = {"worker_config": wc(), "batch_size": 2, "shuffle_buffer_size": None,
                "max_samples_per_sequence": None, "canonical_replicas": R}
    for name, default in host.items():
        if default is REQUIRED or name in ("path", "dataset", "worker_config"):
            continue
        if name == "task_encoder":
            default = me.DefaultTaskEncoder()  # Energon's default is one shared instance
        if fn in ("get_train_dataset", "get_val_dataset"):
            kw = {k: v for k, v in required.items() if k in host or k == "canonical_replicas"}
            ds = getattr(ze, fn)(text_ds, **{**kw, name: default})
            dl = ze.get_savable_loader(ds)
        else:
            ds = ze.get_train_dataset(text_ds, **required)
            dl = getattr(ze, fn)(ds, **{name: default})
        assert len(take(dl, 2)) == 2, (fn, name)
