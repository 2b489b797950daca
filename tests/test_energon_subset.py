"""Metadataset ``subset`` ranges (issue 12): plain entries, nested YAMLs, ``split_part`` and weighted ``blend``
leaves give the samples megatron.energon 7.4's own loader gives for the same metadataset; and a subset range
repeats a fixed part of a dataset as Energon does.

Oracle: megatron.energon's loader (``get_val_dataset`` / ``get_train_dataset`` + ``get_loader``) and its
``DatasetSubset.compute_subset``, never our own parsing. Datasets are written with webdataset and prepared
with Energon's prepare API (tests/energon_data.py).
"""
from __future__ import annotations

import os
from collections import Counter

import pytest

pytest.importorskip("torch")
pytest.importorskip("megatron.energon")
pytest.importorskip("webdataset")

import yaml  # noqa: E402
from megatron import energon as me  # noqa: E402

import energon_data as E  # noqa: E402
from zephon.formats import DataError, open_dataset  # noqa: E402
from zephon.formats import energon as zen  # noqa: E402

OTHER_SHARDS, OTHER_PER_SHARD = 3, 8  # second dataset: keys u0000..u0023, split train = all


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    """``text``: 18 train samples in 3 tars (keys t0000..t0017; t0002 and t0011 excluded; a 4th tar excluded
    whole) and a val tar (t0024..t0029). ``other``: 24 train samples (u0000..u0023)."""
    d = str(tmp_path_factory.mktemp("energon_subset"))
    text, _keys = E.text_dataset(d)
    other = os.path.join(d, "other")
    E.write_text_tars(other, shards=OTHER_SHARDS, per_shard=OTHER_PER_SHARD, prefix="u", extra_json=False)
    E.energon_prepare(other, {"train": r".*"}, dataset_yaml={
        "sample_type": {"__module__": "megatron.energon", "__class__": "TextSample"}, "field_map": {"text": "txt"}})
    return {"dir": d, "text": text, "other": other}


def _wc(rank=0, world=1, workers=0):
    return me.WorkerConfig(rank=rank, world_size=world, num_workers=workers)


def _yaml(path, splits: dict) -> str:
    with open(path, "w") as f:
        yaml.safe_dump({"__module__": "megatron.energon", "__class__": "MetadatasetV2", "splits": splits}, f,
                       sort_keys=False)
    return str(path)


def energon_one_pass(path, split_part) -> Counter:
    """Keys of one ordered pass of Energon's own validation loader over the metadataset split."""
    ds = me.get_val_dataset(path, split_part=split_part, worker_config=_wc(), batch_size=None)
    return Counter(s.__key__ for s in me.get_loader(ds))


def energon_epoch(path, split_part="train") -> Counter:
    """Keys of one pass (``repeat=False``) of Energon's own training loader, unshuffled."""
    ds = me.get_train_dataset(path, split_part=split_part, worker_config=_wc(), batch_size=None,
                              shuffle_buffer_size=None, max_samples_per_sequence=None, repeat=False)
    return Counter(s.__key__ for s in me.get_loader(ds))


# Plain (unblended) entries: relative, absolute, absolute to "end", another split_part, a nested YAML whose
# outer reference narrows the inner leaf's absolute range. Each keeps some but not all of the split.
PLAIN = {
    "percent": {"path": "{text}", "subset": {"range": ["10%", "70%"]}},
    "absolute": {"path": "{text}", "subset": {"range": [3, 14]}},
    "absolute_to_end": {"path": "{text}", "subset": {"range": [5, "end"]}},
    "split_part": {"path": "{text}", "split_part": "val", "subset": {"range": ["50%", "100%"]}},
    "nested": {"path": "inner.yaml", "subset": {"range": ["0%", "50%"]}},
}


def _plain_yaml(data, tmp_path, case) -> str:
    _yaml(tmp_path / "inner.yaml", {"train": {"path": data["text"], "subset": {"range": [2, 16]}}})
    entry = {k: (v.format(**data) if isinstance(v, str) else v) for k, v in PLAIN[case].items()}
    return _yaml(tmp_path / "plain.yaml", {"train": entry})


@pytest.mark.contract("energon.metadataset")
@pytest.mark.parametrize("case", sorted(PLAIN))
def test_plain_subset_reads_energons_samples(data, tmp_path, case):
    """Format level: the leaf ``load_metadataset`` gives, opened with its subset, holds exactly the keys of
    Energon's loader over the same metadataset, with Energon's ``compute_subset`` bounds."""
    from megatron.energon.epathlib import EPath
    from megatron.energon.metadataset.loader import load_dataset

    path = _plain_yaml(data, tmp_path, case)
    theirs = energon_one_pass(path, "train")
    (leaf,) = zen.load_metadataset(path, "train")
    ds = open_dataset(leaf["path"], format="energon", split_part=leaf["split_part"], subset=leaf["subset"])
    ours = Counter(r["__key__"] for sid, n in enumerate(ds.shard_sizes) for r in ds.read(sid, range(n)))
    assert ours == theirs and 0 < len(theirs) < open_dataset(leaf["path"], split_part=leaf["split_part"]).num_samples
    (ld,) = load_dataset(EPath(path)).get_datasets(training=False, split_part="train", worker_config=_wc()).datasets
    total = sum(m.raw_count for m in open_dataset(leaf["path"], split_part=leaf["split_part"]).metas)
    assert ds.subset["bounds"] == ld.dataset.subset.compute_subset(total)


@pytest.mark.contract("energon.metadataset")
@pytest.mark.parametrize("case", sorted(PLAIN))
def test_plain_subset_entry_gives_energons_samples_through_the_adapter(data, tmp_path, case):
    """The crash of issue 12: get_train_dataset / get_val_dataset on a metadataset whose entry has a subset
    open, and one pass yields exactly the keys Energon's loader yields for it, each once."""
    ze = pytest.importorskip("zephon_energon")
    path = _plain_yaml(data, tmp_path, case)
    theirs = energon_one_pass(path, "train")
    assert energon_epoch(path) == theirs
    train = ze.get_train_dataset(path, worker_config=_wc(), batch_size=None, shuffle_buffer_size=4,
                                 max_samples_per_sequence=None, repeat=False, canonical_replicas=2)
    assert Counter(s.__key__ for s in ze.get_savable_loader(train)) == theirs
    val = ze.get_val_dataset(path, split_part="train", worker_config=_wc(), batch_size=None)
    assert Counter(s.__key__ for s in ze.get_loader(val)) == theirs


def _blend_yaml(data, tmp_path) -> str:
    """A weighted blend with its own subset [0%, 80%] over two leaves with subsets: text [10%, 90%] (merged:
    [10%, 74%] of 18 -> [1, 13)) and other [4, 20] (absolute, then 80% of it -> [4, 16))."""
    return _yaml(tmp_path / "blend.yaml", {"train": {"subset": {"range": ["0%", "80%"]}, "blend": [
        {"path": data["text"], "weight": 2, "subset": {"range": ["10%", "90%"]}},
        {"path": data["other"], "weight": 1, "subset": {"range": [4, 20]}}]}})


def _per_leaf(keys) -> dict[str, set]:
    return {"text": {k for k in keys if k.startswith("t")}, "other": {k for k in keys if k.startswith("u")}}


@pytest.mark.contract("energon.metadataset")
def test_blend_leaf_subsets_give_energons_samples(data, tmp_path):
    """Inside a weighted blend: the set of samples each leaf contributes is exactly the one Energon's loader
    draws from that leaf (blend order differs between loaders, so sets are compared per leaf)."""
    ze = pytest.importorskip("zephon_energon")
    path = _blend_yaml(data, tmp_path)
    ds = me.get_train_dataset(path, worker_config=_wc(), batch_size=None, shuffle_buffer_size=None,
                              max_samples_per_sequence=None)
    theirs = []
    for s in me.get_loader(ds):  # a blend repeats: 600 draws see every sample of both (12 + 12) many times
        theirs.append(s.__key__)
        if len(theirs) == 600:
            break
    theirs = _per_leaf(theirs)
    full = {"text": open_dataset(data["text"], split_part="train").num_samples, "other": OTHER_SHARDS * OTHER_PER_SHARD}
    assert all(0 < len(theirs[k]) < full[k] for k in full)  # both subsets bite
    mine = ze.get_savable_loader(ze.get_train_dataset(path, worker_config=_wc(), batch_size=None,
                                                      shuffle_buffer_size=4, max_samples_per_sequence=None,
                                                      canonical_replicas=2))
    got = []
    for s in mine:
        got.append(s.__key__)
        if len(got) == 600:
            break
    assert _per_leaf(got) == theirs
    assert abs(sum(k.startswith("t") for k in got) / len(got) - 2 / 3) < 0.08  # blend weights 2:1 kept


@pytest.mark.contract("energon.metadataset")
def test_blend_leaf_subsets_equal_energons_merge(data, tmp_path):
    """Format level: the merged leaf subsets and their bounds equal Energon's for the blend above."""
    from megatron.energon.epathlib import EPath
    from megatron.energon.metadataset.loader import load_dataset

    path = _blend_yaml(data, tmp_path)
    leaves = zen.load_metadataset(path, "train")
    theirs = load_dataset(EPath(path)).get_datasets(training=True, split_part="train", worker_config=_wc()).datasets
    assert len(leaves) == len(theirs) == 2
    for leaf, ld in zip(leaves, theirs):
        sub = ld.dataset.subset
        assert leaf["subset"]["range"] == pytest.approx(sub.range)
        assert leaf["subset"]["absolute_range"] == sub.absolute_range
        ds = open_dataset(leaf["path"], split_part=leaf["split_part"], subset=leaf["subset"])
        total = sum(m.raw_count for m in open_dataset(leaf["path"], split_part=leaf["split_part"]).metas)
        assert ds.subset["bounds"] == sub.compute_subset(total)
    assert [zen.subset_bounds(leaf["subset"], 18 if i == 0 else 24) for i, leaf in enumerate(leaves)] == \
        [(1, 13), (4, 16)]


@pytest.mark.contract("energon.metadataset")
def test_subset_range_repeats_part_of_a_dataset_like_energon(data, tmp_path):
    """A fixed part repeated (1 repetition plus the same dataset again with subset [0%, 50%], the alternative to
    a fractional repetition that takes another part each epoch) yields one pass with the per-key counts
    Energon's own loader gives for that metadataset."""
    ze = pytest.importorskip("zephon_energon")
    fixed = _yaml(tmp_path / "fixed.yaml", {"train": {"blend_epochized": [
        {"path": data["text"], "repetitions": 1},
        {"path": data["text"], "repetitions": 1, "subset": {"range": ["0%", "50%"]}},
        {"path": data["other"], "repetitions": 1}]}})
    theirs = energon_epoch(fixed)
    assert sorted(set(theirs.values())) == [1, 2]  # the first half of text twice, the rest once
    train = ze.get_train_dataset(fixed, worker_config=_wc(), batch_size=None, shuffle_buffer_size=4,
                                 max_samples_per_sequence=None, repeat=False, canonical_replicas=2)
    assert Counter(s.__key__ for s in ze.get_savable_loader(train)) == theirs


# ------------------------------------------------------------------------------------------ argument checks


def test_subset_keyword_forms_and_errors(data):
    """``open_dataset(..., subset=)`` takes the YAML form or a merged leaf subset (same result); a malformed
    or out-of-range subset is refused naming what is wrong; a subset of a subset is refused."""
    yaml_form = open_dataset(data["text"], split_part="train", subset={"range": ["10%", "70%"]})
    merged = open_dataset(data["text"], split_part="train", subset={"range": (0.1, 0.7), "absolute_range": None})
    assert yaml_form.subset["bounds"] == merged.subset["bounds"] == (1, 12)
    assert yaml_form.fingerprint() == merged.fingerprint()
    assert yaml_form.fingerprint()["subset"] != open_dataset(data["text"], split_part="train").fingerprint()["subset"]
    with pytest.raises(ValueError, match="percentage"):
        open_dataset(data["text"], split_part="train", subset={"range": ["10", "70%"]})
    with pytest.raises(ValueError, match=r"needs an int end"):
        open_dataset(data["text"], split_part="train", subset={"range": [1, "70%"]})
    with pytest.raises(DataError, match=r"split part 'train'.*out of range for 18 samples") as err:
        open_dataset(data["text"], split_part="train", subset={"range": [3, 40]})
    assert err.value.path == data["text"]
    with pytest.raises(DataError, match="leaves no samples"):
        open_dataset(data["text"], split_part="train", subset={"range": [2, 3]})  # only t0002, which is excluded
    with pytest.raises(ValueError, match="already the subset"):
        yaml_form.with_subset({"range": ["0%", "50%"]})
