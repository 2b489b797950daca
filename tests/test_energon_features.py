"""zephon_energon features Megatron users configure (issue 25 item 3), each against megatron-energon 7.4 itself
(elastic resumes of the other sources and two more join forms: `pytest -m slow tests/test_energon_features.py`).

Data: the prepared text dataset of test_energon_adapter (real ``webdataset.ShardWriter`` tars, Energon's own
prepare). Oracles: megatron.energon's loader on the same data and task encoder (key multiset per pass, batch
composition rule); an uninterrupted single-rank run for elastic resumes (another world size and worker count).
"""
from __future__ import annotations

import json
import os
from collections import Counter

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("megatron.energon")

from megatron import energon as me  # noqa: E402

import zephon_energon as ze  # noqa: E402
from test_energon_adapter import R, _global_batches, energon_samples, take, train_loader, wc  # noqa: E402
import test_energon_adapter  # noqa: E402

text_ds = test_energon_adapter.text_ds  # the same module-scoped dataset fixture


# -- grouped batching (TaskEncoder.batch_group_criterion) ---------------------------------------------
SIZES = {0: 2, 1: 3, 2: 4}


def _group(text: str) -> int:
    return len(text) % 3


class GroupTE(ze.DefaultTaskEncoder):
    """Groups text samples by ``len(text) % 3``: the fixed ``batch_size`` or, without one, 2, 3 or 4 per group."""

    def __init__(self, sized: bool):
        super().__init__()
        self.sized = sized

    def batch_group_criterion(self, sample):
        g = _group(sample.text)
        return g, (SIZES[g] if self.sized else None)


def _batches_by_group(batches, texts):
    """``[(group, keys)]`` of batches; asserts each batch holds one group only."""
    out = []
    for keys in batches:
        groups = {_group(texts[k]) for k in keys}
        assert len(groups) == 1, f"batch {keys} mixes groups {groups}"
        out.append((groups.pop(), keys))
    return out


def _check_rule(batches, texts, size_of, streams: int, drop_last: bool):
    """Energon's GroupBatchDataset rule: a batch is one group's; a group's batches are full except, without
    drop_last, its last batch in each independent stream (an Energon worker, a Zephon lane)."""
    short = Counter()
    for g, keys in _batches_by_group(batches, texts):
        assert len(keys) <= size_of(g)
        if len(keys) < size_of(g):
            short[g] += 1
    assert not short if drop_last else all(n <= streams for n in short.values()), short


@pytest.mark.contract("energon.task_encoder")
@pytest.mark.parametrize("sized", [False, True])
def test_grouped_batches_follow_energons_rule_and_keys(text_ds, sized):
    texts = {k: s.text for k, s in energon_samples(text_ds).items()}
    bs = None if sized else 4
    size_of = (lambda g: SIZES[g]) if sized else (lambda g: 4)  # noqa: E731
    theirs = [tuple(b.__key__) for b in me.get_loader(me.get_train_dataset(
        text_ds, worker_config=wc(), batch_size=bs, shuffle_buffer_size=None, max_samples_per_sequence=None,
        repeat=False, task_encoder=GroupTE(sized)))]
    ours = take(train_loader(text_ds, batch_size=bs, repeat=False, task_encoder=GroupTE(sized), workers=2,
                             flush_span=8, chunk_size=4), 10 ** 6)
    _check_rule(theirs, texts, size_of, streams=1, drop_last=False)
    _check_rule(ours, texts, size_of, streams=R, drop_last=False)
    # every sample once per pass, as in Energon; each group has Energon's number of samples
    assert Counter(k for b in ours for k in b) == Counter(k for b in theirs for k in b) == Counter(texts.keys())
    # buckets carried across flush sentinels: far fewer short batches than one per group and span
    assert sum(len(b) < size_of(_group(texts[b[0]])) for b in ours) <= 3 * R
    dropped = take(train_loader(text_ds, batch_size=bs, repeat=False, batch_drop_last=True,
                                task_encoder=GroupTE(sized), flush_span=8, chunk_size=4), 10 ** 6)
    _check_rule(dropped, texts, size_of, streams=R, drop_last=True)


GROUP_KW = dict(task_encoder=GroupTE(True), batch_size=None, flush_span=8, chunk_size=4)


@pytest.fixture(scope="module")
def group_save(text_ds):
    """World size 2 with 2 workers per rank, grouped batching, saved after k global steps."""
    k = 4
    ref = take(train_loader(text_ds, **GROUP_KW), R * (k + 3))
    runs, states = {}, []
    for r in range(2):
        dl = train_loader(text_ds, rank=r, world=2, workers=2, **GROUP_KW)
        runs[r] = take(dl, R // 2 * k)
        states.append(dl.save_state_global(0)[0])
        dl.close()
    assert _global_batches(runs, 2, k) == [ref[R * s:R * (s + 1)] for s in range(k)]
    assert '"carry"' in json.dumps(states)  # buckets were held across a sentinel at the save
    return ref, states, k


@pytest.mark.contract("energon.task_encoder", "energon.elastic")
@pytest.mark.parametrize("new_world,new_workers", [
    pytest.param(1, 1, marks=pytest.mark.slow), (4, 0), pytest.param(8, 0, marks=pytest.mark.slow)])
def test_grouped_batching_resumes_elastically(text_ds, group_save, new_world, new_workers):
    ref, states, k = group_save
    runs = {}
    for r in range(new_world):
        dl = train_loader(text_ds, rank=r, world=new_world, workers=new_workers, **GROUP_KW)
        dl.restore_state_global(states)
        runs[r] = take(dl, (R // new_world) * 3)
        dl.close()
    assert _global_batches(runs, new_world, 3) == [ref[R * (k + s):R * (k + s + 1)] for s in range(3)]


# -- fractional blend_epochized repetitions ---------------------------------------------------------------
import test_energon_subset  # noqa: E402

data = test_energon_subset.data  # text (16 train samples) and other (24 samples, no excluded key)


def _frac_yaml(data, tmp_path, r) -> str:
    # other has no excluded key: Energon's fraction is of its length, which counts excluded keys too
    return test_energon_subset._yaml(tmp_path / f"frac{r}.yaml", {"train": {"blend_epochized": [
        {"path": data["text"], "repetitions": 1}, {"path": data["other"], "repetitions": r}]}})


def _energon_keys(path, repeat: bool, n: int = 10 ** 6) -> list:
    ds = me.get_train_dataset(path, worker_config=wc(), batch_size=None, shuffle_buffer_size=None,
                              max_samples_per_sequence=None, repeat=repeat)
    return take(me.get_loader(ds), n, lambda s: s.__key__)


def _shape(c: Counter) -> Counter:
    """How many keys of each dataset appear how many times."""
    return Counter((k[0], n) for k, n in c.items())


@pytest.mark.contract("energon.metadataset")
@pytest.mark.parametrize("r", [0.5, 1.5])
def test_fractional_repetitions_take_energons_per_epoch_fraction(data, tmp_path, r):
    """One epoch holds floor(r x 24) samples of ``other`` (Energon's count) and the next epoch takes the next part
    of its shuffled stream: two epochs of r=0.5 are one whole pass (equal to Energon's two epochs), of r=1.5
    three passes. (Energon 7.4.1 gives epochs after the first only floor(r) x 24 for r > 1: its RepeatDataset
    counts the rest of the interrupted pass as a whole repetition; docs/energon.md.)"""
    path = _frac_yaml(data, tmp_path, r)
    theirs = Counter(_energon_keys(path, repeat=False))
    E = sum(theirs.values())
    assert E == 16 + int(r * 24)
    ours = Counter(take(train_loader(path, batch_size=None, repeat=False, shuffle_buffer_size=None,
                                     canonical_replicas=4), 10 ** 6, lambda s: s.__key__))
    assert _shape(ours) == _shape(theirs)  # e.g. r=1.5: every text key once, 12 other keys twice, 12 once
    # chunk_size 1 over 4 lanes: the first 2E samples of the loader are stream positions [0, 2E)
    ours2 = Counter(take(train_loader(path, batch_size=None, shuffle_buffer_size=None, canonical_replicas=4,
                                      chunk_size=1), 2 * E, lambda s: s.__key__))
    assert _shape(ours2) == Counter({("t", 2): 16, ("u", int(2 * r)): 24})  # two epochs: whole passes of other
    if r < 1:
        assert ours2 == Counter(_energon_keys(path, repeat=True, n=2 * E))


def _global(per_rank, lanes, world, steps):
    L = lanes // world
    return [[b for r in range(world) for b in per_rank[r][L * s:L * (s + 1)]] for s in range(steps)]


def _elastic(path, lanes, save, resumes, k=3, m=3, **kw):
    """Save at ``save = (world, workers)`` after k global steps; each ``(world, workers)`` of ``resumes``
    restored from it gives the next m global steps of an uninterrupted single-rank run."""
    ref = take(train_loader(path, canonical_replicas=lanes, **kw), lanes * (k + m))
    runs, states = {}, []
    for r in range(save[0]):
        dl = train_loader(path, rank=r, world=save[0], workers=save[1], canonical_replicas=lanes, **kw)
        runs[r] = take(dl, lanes // save[0] * k)
        states.append(dl.save_state_global(0)[0])
        dl.close()
    assert _global(runs, lanes, save[0], k) == [ref[lanes * s:lanes * (s + 1)] for s in range(k)]
    for world, workers in resumes:
        runs = {}
        for r in range(world):
            dl = train_loader(path, rank=r, world=world, workers=workers, canonical_replicas=lanes, **kw)
            dl.restore_state_global(states)
            runs[r] = take(dl, lanes // world * m)
            dl.close()
        assert _global(runs, lanes, world, m) == [ref[lanes * (k + s):lanes * (k + s + 1)] for s in range(m)], \
            (world, workers)
    return states


@pytest.mark.slow  # the lane engine's elastic resume is the same for every source; run with -m slow
@pytest.mark.contract("energon.metadataset", "energon.elastic")
def test_fractional_repetitions_resume_elastically(data, tmp_path):
    _elastic(_frac_yaml(data, tmp_path, 1.5), 4, (2, 2), [(1, 1), (4, 0)], batch_size=2)


# -- join metadatasets -----------------------------------------------------------------------------------
def join_texts(primary, extra):
    """A joiner function (list join): the primary's text and the extra's, or '-' where nonmatch: none gave None."""
    return me.TextSample(__key__=primary.__key__, __restore_key__=primary.__restore_key__,
                         __subflavors__=primary.__subflavors__, __sources__=primary.__sources__,
                         text=f"{primary.text}|{extra.text if extra is not None else '-'}")


def join_named(main, extra):
    """A joiner function (mapping join): the same, by name."""
    return join_texts(main, extra)


@pytest.fixture(scope="module")
def extra_ds(tmp_path_factory):
    """Texts keyed like text_ds's, except every key whose number is 3 mod 7 (those have no match)."""
    import webdataset as wds

    root = tmp_path_factory.mktemp("energon_extra")
    with wds.ShardWriter(str(root / "data-%03d.tar"), maxcount=50, verbose=0) as w:
        for i in range(200):
            if i % 7 != 3:
                w.write({"__key__": f"s{i:05d}", "txt": f"extra {i}"})
    test_energon_adapter._prepare(str(root), sorted(p.name for p in root.glob("*.tar")), test_energon_adapter.TEXT_YAML)
    return str(root)


def _join_yaml(tmp_path, text_ds, extra_ds, nonmatch, joiner, named=False) -> str:
    import yaml
    from megatron.energon.epathlib import EPath
    from megatron.energon.metadataset.loader import prepare_metadataset

    refs = [{"path": text_ds}, {"path": extra_ds, "nonmatch": nonmatch}]
    join = dict(zip(("main", "extra"), refs)) if named else refs
    path = tmp_path / f"join-{nonmatch}-{named}.yaml"
    with open(path, "w") as f:
        yaml.safe_dump({"__module__": "megatron.energon", "__class__": "MetadatasetV2", "splits": {"train": {
            "join": join, "joiner": joiner}}}, f, sort_keys=False)
    prepare_metadataset(EPath(str(path)))  # what `energon prepare <metadataset.yaml>` runs: Energon's join index
    return str(path)


FN = {"__module__": __name__, "__function__": "join_texts"}


@pytest.mark.contract("energon.metadataset")
@pytest.mark.parametrize("nonmatch,joiner,named", [
    pytest.param("skip", FN, False, marks=pytest.mark.slow), pytest.param("none", FN, False, marks=pytest.mark.slow),
    ("none", {"__module__": __name__, "__function__": "join_named"}, True),
    ("skip", {"__module__": "megatron.energon", "__class__": "TextSample"}, False)])
def test_join_samples_equal_energons(text_ds, extra_ds, tmp_path, nonmatch, joiner, named):
    """Every joined sample equals Energon's for the same key (a sample type's from_joined or a function, a
    list or a mapping join); one pass holds Energon's keys once each (skip drops the unmatched keys). Energon
    7.4.1 cannot read a nonmatch: none join (its reader fails on the missing member), so there its skip join
    is the oracle for the matched keys, and its primary samples for the others."""
    path = _join_yaml(tmp_path, text_ds, extra_ds, nonmatch, joiner, named)
    ref = path if nonmatch == "skip" else _join_yaml(tmp_path, text_ds, extra_ds, "skip", joiner, named)
    theirs = {s.__key__: s.text for s in me.get_loader(me.get_train_dataset(
        ref, worker_config=wc(), batch_size=None, shuffle_buffer_size=None, max_samples_per_sequence=None,
        repeat=False))}
    unmatched = {f"s{i:05d}" for i in range(150) if i % 7 == 3}  # 21 keys; s00060 is excluded anyway
    assert len(theirs) == 149 - len(unmatched)
    if nonmatch == "none":
        theirs.update({k: f"{s.text}|-" for k, s in energon_samples(text_ds).items() if k in unmatched})
        assert len(theirs) == 149
    ours = take(train_loader(path, batch_size=None, repeat=False, workers=2), 10 ** 6, lambda s: (s.__key__, s.text))
    assert Counter(k for k, _ in ours) == Counter(theirs.keys())
    assert dict(ours) == theirs


@pytest.mark.contract("energon.metadataset")
def test_join_without_a_match_is_refused_naming_the_key(text_ds, extra_ds, tmp_path):
    import yaml

    path = tmp_path / "join-error.yaml"
    yaml.safe_dump({"__module__": "megatron.energon", "__class__": "MetadatasetV2", "splits": {"train": {
        "join": [{"path": text_ds}, {"path": extra_ds}], "joiner": FN}}}, open(path, "w"))
    with pytest.raises(Exception, match=r"s00003.*missing"):
        train_loader(str(path), batch_size=None)


@pytest.mark.slow  # the lane engine's elastic resume is the same for every source; run with -m slow
@pytest.mark.contract("energon.metadataset", "energon.elastic")
def test_join_resumes_elastically(text_ds, extra_ds, tmp_path):
    path = _join_yaml(tmp_path, text_ds, extra_ds, "skip", FN)
    _elastic(path, 4, (2, 2), [(1, 1), (4, 0)], batch_size=2)


# -- JSONL datasets (Energon 7.2+: crude samples, cooked) -------------------------------------------------
@ze.stateless
def cook_jsonl(sample):
    return me.TextSample(**ze.basic_sample_keys(sample), text=f"{sample['json']['text']}#{sample['json']['n']}")


class JsonlTE(ze.DefaultTaskEncoder):
    cookers = [ze.Cooker(cook_jsonl)]


@pytest.fixture(scope="module")
def jsonl_ds(tmp_path_factory):
    """90 JSON objects in one .jsonl file (two blank lines, which are not samples), indexed by Energon's
    own JSONL preparation (``energon prepare`` on a .jsonl file)."""
    from megatron.energon.flavors.jsonl.jsonl_prepare import JsonlPreparator

    path = tmp_path_factory.mktemp("energon_jsonl") / "docs.jsonl"
    lines = [json.dumps({"text": f"doc {i} " + "xy" * (i % 5), "n": i}) for i in range(90)]
    lines[10:10] = [""]
    lines[50:50] = ["   "]
    path.write_text("\n".join(lines) + "\n")
    assert JsonlPreparator.prepare_dataset(path) == 90
    return str(path)


@pytest.mark.contract("energon.format", "energon.task_encoder")
def test_jsonl_crude_samples_equal_energons(jsonl_ds, tmp_path):
    """A .jsonl path (and a metadataset leaf naming it): each key's cooked sample, restore key and subflavors
    equal Energon's; one pass is every line once."""
    ref = {s.__key__: s for s in me.get_loader(me.get_train_dataset(
        jsonl_ds, worker_config=wc(), batch_size=None, shuffle_buffer_size=None, max_samples_per_sequence=None,
        repeat=False, task_encoder=JsonlTE()))}
    assert sorted(ref, key=int) == [str(i) for i in range(90)]
    meta = tmp_path / "jsonl.yaml"
    meta.write_text(f"__module__: megatron.energon\n__class__: MetadatasetV2\nsplits:\n  train:\n    path: {jsonl_ds}\n"
                    f"    subflavors:\n      src: j\n")
    theirs_meta = {s.__key__: s.__subflavors__ for s in me.get_loader(me.get_train_dataset(
        str(meta), worker_config=wc(), batch_size=None, shuffle_buffer_size=None, max_samples_per_sequence=None,
        repeat=False, task_encoder=JsonlTE()))}
    for path, subflavors, workers in ((jsonl_ds, None, 2), (str(meta), theirs_meta, 0)):
        ours = take(train_loader(path, batch_size=None, repeat=False, workers=workers, task_encoder=JsonlTE()),
                    10 ** 6, lambda s: s)
        assert Counter(s.__key__ for s in ours) == Counter(ref.keys())
        for s in ours:
            r = ref[s.__key__]
            assert type(s) is me.TextSample and s.text == r.text
            assert tuple(s.__restore_key__) == tuple(r.__restore_key__[-2:])
            assert s.__subflavors__ == (r.__subflavors__ if subflavors is None else subflavors[s.__key__])


@pytest.mark.slow  # the lane engine's elastic resume is the same for every source; run with -m slow
@pytest.mark.contract("energon.format", "energon.elastic")
def test_jsonl_resumes_elastically(jsonl_ds):
    _elastic(jsonl_ds, 4, (2, 2), [(1, 1), (4, 0)], batch_size=2, task_encoder=JsonlTE())


# -- dataset.yaml Python hooks (sample_loader / part_filter) and crude datasets with cookers ----------------
HOOKS = '''
def load(raw):
    return {"text": raw["txt"] + "/" + str(raw["json"]["n"]) + "/" + ",".join(sorted(k for k in raw if k[0] != "_"))}

def parts(part):
    return part != "json"
'''


@pytest.fixture(scope="module")
def hook_ds(tmp_path_factory):
    """The same text tars (txt + json parts) prepared twice: a TextSample dataset whose dataset.yaml names a
    sample_loader and part_filter in .nv-meta/hooks.py, and a CrudeWebdataset with a part_filter function."""
    import energon_data as E

    out = {}
    for kind, yaml_ in (("loader", {"sample_type": {"__module__": "megatron.energon", "__class__": "TextSample"},
                                    "sample_loader": "hooks.py:load", "part_filter": ["txt", "json"]}),
                        ("crude", {"__module__": "megatron.energon", "__class__": "CrudeWebdataset",
                                   "part_filter": "hooks.py:parts", "subflavors": {"kind": "crude"}})):
        root = str(tmp_path_factory.mktemp(f"energon_hooks_{kind}"))
        E.write_text_tars(root, shards=3, per_shard=10)
        E.energon_prepare(root, {"train": r".*"}, dataset_yaml=yaml_)
        with open(os.path.join(root, ".nv-meta", "hooks.py"), "w") as f:
            f.write(HOOKS)
        out[kind] = root
    return out


@ze.stateless
def cook_crude(sample):
    parts = ",".join(sorted(k for k in sample if not k.startswith("__")))
    return me.TextSample(**ze.basic_sample_keys(sample), text=f"{sample['txt']}|{parts}")


class CrudeTE(ze.DefaultTaskEncoder):
    cookers = [ze.Cooker(cook_crude, has_subflavors={"kind": "crude"})]


def _by_key(path, te, ours: bool):
    if ours:
        return dict(take(train_loader(path, batch_size=None, repeat=False, workers=2, task_encoder=te,
                                      canonical_replicas=4), 10 ** 6, lambda s: (s.__key__, s.text)))
    return {s.__key__: s.text for s in me.get_loader(me.get_train_dataset(
        path, worker_config=wc(), batch_size=None, shuffle_buffer_size=None, max_samples_per_sequence=None,
        repeat=False, task_encoder=te))}


@pytest.mark.contract("energon.format", "energon.task_encoder")
@pytest.mark.parametrize("kind", ["loader", "crude"])
def test_dataset_hooks_give_energons_samples(hook_ds, kind):
    """sample_loader + part_filter (list), and a crude dataset's part_filter function + a cooker: each key's
    sample equals Energon's (the hooks saw the same parts)."""
    te = CrudeTE() if kind == "crude" else ze.DefaultTaskEncoder()
    theirs = _by_key(hook_ds[kind], te, ours=False)
    assert len(theirs) == 30 and all(("|txt" if kind == "crude" else "/json,txt") in t for t in theirs.values())
    assert _by_key(hook_ds[kind], te, ours=True) == theirs


@pytest.mark.contract("energon.elastic")
def test_dataset_hook_module_is_part_of_the_fingerprint(hook_ds, tmp_path):
    """A state saved with one hooks.py restores elastically with it, and is refused once the file changed."""
    import shutil

    root = str(tmp_path / "copy")
    shutil.copytree(hook_ds["loader"], root)
    states = _elastic(root, 4, (2, 1), [(1, 0)], batch_size=2)
    with open(os.path.join(root, ".nv-meta", "hooks.py"), "a") as f:
        f.write("\n# edited\n")
    dl = train_loader(root, batch_size=2, canonical_replicas=4)
    with pytest.raises(Exception, match=r"sample_loader\.sha256"):
        dl.restore_state_global(states)


# -- shuffle_over_epochs_multiplier ------------------------------------------------------------------------
@pytest.mark.contract("energon.keywords")
def test_shuffle_over_epochs_multiplier_is_energons_pass_of_m_epochs(data):
    """Multiplier 2: one pass (repeat=False) holds every sample twice, as Energon's, and its first half is not
    one whole epoch (the copies are shuffled together); -1 (with replacement) is refused saying why."""
    other = data["other"]

    def energon_pass(m):
        return _energon_keys_kw(other, shuffle_over_epochs_multiplier=m)

    theirs = Counter(energon_pass(2))
    ours = take(train_loader(other, batch_size=None, repeat=False, shuffle_buffer_size=None, canonical_replicas=4,
                             shuffle_over_epochs_multiplier=2), 10 ** 6, lambda s: s.__key__)
    assert Counter(ours) == theirs == Counter({f"u{i:04d}": 2 for i in range(24)})
    ordered = take(train_loader(other, batch_size=None, shuffle_buffer_size=None, canonical_replicas=4, chunk_size=1,
                                shuffle_over_epochs_multiplier=2), 4 * 24, lambda s: s.__key__)
    assert Counter(ordered) == Counter({f"u{i:04d}": 4 for i in range(24)})  # two passes of two epochs
    assert len(set(ordered[:24])) < 24  # stream positions [0, 24): not one epoch
    with pytest.raises(ze.RefusedKeyword, match="with replacement"):
        train_loader(other, shuffle_over_epochs_multiplier=-1)


def _energon_keys_kw(path, **kw) -> list:
    ds = me.get_train_dataset(path, worker_config=wc(), batch_size=None, shuffle_buffer_size=None,
                              max_samples_per_sequence=None, repeat=False, **kw)
    return take(me.get_loader(ds), 10 ** 6, lambda s: s.__key__)


@pytest.mark.slow  # the lane engine's elastic resume is the same for every source; run with -m slow
@pytest.mark.contract("energon.keywords", "energon.elastic")
def test_shuffle_over_epochs_multiplier_resumes_elastically(data):
    _elastic(data["other"], 4, (2, 2), [(1, 1), (4, 0)], batch_size=2, shuffle_over_epochs_multiplier=3)


@pytest.mark.contract("energon.metadataset")
def test_auxiliary_data_in_a_metadataset_is_refused_saying_why(text_ds, tmp_path):
    meta = tmp_path / "aux.yaml"
    meta.write_text(f"__module__: megatron.energon\n__class__: MetadatasetV2\nsplits:\n  train:\n    path: {text_ds}\n"
                    f"    aux:\n      media: {text_ds}\n")
    with pytest.raises(Exception, match=r"aux: auxiliary datasets are not supported.*join"):
        train_loader(str(meta), batch_size=None)
