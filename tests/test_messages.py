"""Messages say what is wrong and what to do (issue 28, item 7): an Energon sample's field map read by Decode, a
checkpoint missing a field or made of garbage, a tokenizer file that is not there."""
from __future__ import annotations

import copy
import json

import pytest

from zephon import Batch, CheckpointError, DataError, Decode, Loader, open_dataset
from zephon.cli import main


def test_decode_reads_an_energon_samples_field_map(tmp_path):
    from energon_data import text_dataset

    root, expected = text_dataset(str(tmp_path))
    ds = open_dataset(root, split_part="train")
    with Loader([ds], [Decode("text"), Batch(1)], canonical_replicas=1, exhaustion="stop", shuffle=False,
                runner="inline") as L:
        texts = [mb["text"][0] for mb in L]
    # the field map says text: txt; write_text_tars wrote "text sample {i} ..." into key t{i:04d}'s txt part
    want = sorted(f"text sample {int(k[1:])} \u00e9\u4e2d" for k in expected["train"])
    assert sorted(texts) == want
    with Loader([ds], [Decode("caption"), Batch(1)], canonical_replicas=1, exhaustion="stop",
                runner="inline") as L:
        with pytest.raises(DataError, match=r"missing field 'caption'.*field_map fields: \['text'\].*parts: "
                                            r"\['txt'\]"):
            next(iter(L))


@pytest.fixture
def state(tmp_path):
    p = tmp_path / "a.jsonl"
    p.write_text("".join(json.dumps({"text": f"d{i}"}) + "\n" for i in range(40)))
    L = Loader([open_dataset(str(p))], [Decode("text"), Batch(1)], canonical_replicas=2, runner="inline")
    it = iter(L)
    for _ in range(5):
        next(it)
    return L, L.checkpoint()


def test_checkpoint_without_lanes_sha256_says_it_is_missing(state):
    L, st = state
    del st["lanes_sha256"]
    with pytest.raises(CheckpointError, match="missing field.*'lanes_sha256'"):
        L.restore(st)


@pytest.mark.parametrize("garbage", [{"format": "zephon-checkpoint/1"},
                                     {"format": "zephon-checkpoint/1", "fingerprint": 7, "config": [], "lanes": "x",
                                      "lanes_sha256": None}])
def test_garbage_checkpoint_says_what_is_wrong(state, garbage):
    L, st = state
    with pytest.raises(CheckpointError) as e:
        L.restore(copy.deepcopy(garbage))
    msg = str(e.value)
    assert "algorithm version" not in msg and "damaged checkpoint" in msg
    for k in ("fingerprint", "config", "lanes", "lanes_sha256"):
        assert repr(k) in msg


def test_missing_tokenizer_file_is_named_as_missing(tmp_path, capsys):
    data = tmp_path / "a.jsonl"
    data.write_text("".join(json.dumps({"text": f"d{i}"}) + "\n" for i in range(8)))
    rc = main(["verify", "--data", str(data), "--tokenizer", "nonexist.json", "--no-progress"])
    err = capsys.readouterr().err
    assert rc == 2 and "'nonexist.json' does not exist" in err


@pytest.mark.parametrize("bad,reason", [({"txt": "doc"}, "missing field 'text'"),
                                        ({"text": None}, "field 'text' is NoneType, expected text")])
def test_jsonl_field_errors_name_the_line(tmp_path, bad, reason):
    """A record the Decode refuses is named with its line, as a malformed line is: sample 6 sits on line 9
    (two blank lines before it)."""
    lines = [json.dumps({"text": f"doc {i}"}) for i in range(10)]
    lines[6] = json.dumps(bad)
    path = tmp_path / "a.jsonl"
    path.write_text("\n".join(lines[:2] + ["", ""] + lines[2:]) + "\n")
    with Loader([open_dataset(str(path))], [Decode("text"), Batch(1)], canonical_replicas=1, exhaustion="stop",
                shuffle=False, runner="inline") as L:
        with pytest.raises(DataError) as e:
            list(L)
    assert f"{path} (shard 0, sample 6, line 9)" in str(e.value) and reason in str(e.value), str(e.value)


def test_edited_checkpoint_duplicate_lane_and_unknown_key_are_named(state):
    """Edits with a recomputed lanes_sha256: lane 0's entry in place of lane 1's is called a duplicate (not
    "lacks lanes [1]"); a top-level key no checkpoint has is refused by name. The unedited state restores."""
    from zephon.checkpoint import digest

    L, st = state
    dup = copy.deepcopy(st)
    dup["lanes"] = [dup["lanes"][0], copy.deepcopy(dup["lanes"][0])]
    dup["lanes_sha256"] = digest(dup["lanes"])
    with pytest.raises(CheckpointError, match=r"lane 0 appears twice \(with the same state\)"):
        L.restore(dup)
    extra = dict(copy.deepcopy(st), resume_from="step 3")
    with pytest.raises(CheckpointError, match="unknown field 'resume_from'"):
        L.restore(extra)
    L.restore(copy.deepcopy(st))


def _two_sets(tmp_path, **kw):
    for n in ("a", "b"):
        (tmp_path / f"{n}.jsonl").write_text("".join(json.dumps({"text": f"{n}{i}"}) + "\n" for i in range(40)))
    return Loader([open_dataset(str(tmp_path / n)) for n in ("a.jsonl", "b.jsonl")], [Decode("text"), Batch(1)],
                  canonical_replicas=2, runner="inline", **kw)


def test_config_diff_shows_weights_as_given_and_shuffle_before_seed(tmp_path):
    """Weights are compared as the proportions the user gave (the summary keeps reduced integers: 0.9 -> 471859);
    when shuffle and seed both differ (zephon_streaming derives the seed from shuffle) shuffle is named first."""
    st = _two_sets(tmp_path).checkpoint()
    with pytest.raises(CheckpointError) as e:
        _two_sets(tmp_path, weights=[0.9, 0.1]).restore(copy.deepcopy(st))
    assert "work.weights differ: checkpoint [0.5, 0.5] vs this loader [0.9, 0.1]" in str(e.value)
    assert "471859" not in str(e.value)
    with pytest.raises(CheckpointError) as e:
        _two_sets(tmp_path, shuffle=False, seed=17).restore(copy.deepcopy(st))
    msg = str(e.value)
    shuffle, seed = "work.shuffle: checkpoint has True, this loader has False", "work.seed: checkpoint has 0"
    assert shuffle in msg and seed in msg and msg.index(shuffle) < msg.index(seed)


@pytest.mark.parametrize("bad", [0, -2, 2.0, True])
def test_canonical_replicas_is_checked_first_with_its_own_message(tmp_path, bad):
    """canonical_replicas=0 said "global_batch_size and unit_size must be >= 1, got None, 256" (the default global
    batch size is derived from it); it is refused by name, with the value given."""
    (tmp_path / "a.jsonl").write_text("".join(json.dumps({"text": f"d{i}"}) + "\n" for i in range(8)))
    with pytest.raises(ValueError) as e:
        Loader([open_dataset(str(tmp_path / "a.jsonl"))], [Decode("text"), Batch(1)], canonical_replicas=bad)
    assert f"canonical_replicas (the number of lanes) must be an int >= 1, got {bad!r}" in str(e.value)
    assert "global_batch_size" not in str(e.value)
