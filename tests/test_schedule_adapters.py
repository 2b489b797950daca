"""Mixture schedules in each host's idiom: a schedule block in an Energon metadataset YAML (Energon PR #208's
``weight: {linear: {...}}``), per-stream ``proportion_schedule`` in zephon_streaming.

Oracles: the schedule evaluated in this file (Energon's step/linear semantics, exact fractions), the sample
keys (which dataset a row came from), and a single-rank run for the elastic comparisons.
"""
from __future__ import annotations

import json
import math
import os
from fractions import Fraction

import pytest

from helpers import schedule_weight, world

torch = pytest.importorskip("torch")


def check_against_integral(per_step, specs, gbs, first_step=0):
    """``per_step``: per-dataset row counts of consecutive global steps from ``first_step``; cumulative counts
    stay within ceil(log2 D) (at least 1) of the integral of the shares."""
    b = max(1, math.ceil(math.log2(len(specs))))
    cum, integral = [0] * len(specs), [Fraction(0)] * len(specs)
    for k, counts in enumerate(per_step):
        w = [schedule_weight(s, first_step + k) for s in specs]
        assert sum(counts) == gbs
        for d in range(len(specs)):
            cum[d] += counts[d]
            integral[d] += gbs * w[d] / sum(w)
            assert abs(cum[d] - integral[d]) < b, (first_step + k, d, cum[d], float(integral[d]))


# ------------------------------------------------------------------------------------------ Energon

@pytest.fixture(scope="module")
def energon_mix(tmp_path_factory):
    pytest.importorskip("megatron.energon")
    pytest.importorskip("webdataset")
    import yaml
    from energon_data import energon_prepare, write_text_tars

    root = str(tmp_path_factory.mktemp("sched_energon"))
    text = {"sample_type": {"__module__": "megatron.energon", "__class__": "TextSample"},
            "field_map": {"text": "txt"}}
    for prefix in ("a", "b"):
        write_text_tars(os.path.join(root, prefix), shards=3, per_shard=40, prefix=prefix, extra_json=False)
        energon_prepare(os.path.join(root, prefix), {"train": r".*"}, dataset_yaml=text)
    specs = [{"linear": {0: 3, 4: 3, 12: 1}}, {"linear": {0: 1, 4: 1, 12: 3}}]  # a 3:1 ramp to 1:3 (total 4)
    meta = {"__module__": "megatron.energon", "__class__": "MetadatasetV2", "splits": {"train": {"blend": [
        {"path": "a", "weight": specs[0]}, {"path": "b", "weight": specs[1]}]}}}
    path = os.path.join(root, "curriculum.yaml")
    with open(path, "w") as f:
        yaml.safe_dump(meta, f, sort_keys=False)
    return path, specs


def energon_steps(path, world, steps, batch_size=2, lanes=8):
    """Per global step, the keys of every rank's batches (lane order: rank 0's lanes first)."""
    import zephon_energon as ze

    per_rank = lanes // world
    out = [[] for _ in range(steps)]
    for rank in range(world):
        ds = ze.get_train_dataset(path, worker_config=ze.WorkerConfig(rank=rank, world_size=world, num_workers=0),
                                  batch_size=batch_size, shuffle_buffer_size=None, max_samples_per_sequence=None,
                                  canonical_replicas=lanes)
        it = iter(ze.get_savable_loader(ds))
        for s in range(steps):
            for _ in range(per_rank):
                out[s] += list(next(it).__key__)
    return out


def test_energon_metadataset_schedule_follows_the_integral_at_every_step(energon_mix):
    path, specs = energon_mix
    steps = energon_steps(path, 1, 16)
    per_step = [[sum(k.startswith(p) for k in keys) for p in ("a", "b")] for keys in steps]
    check_against_integral(per_step, specs, gbs=16)  # the Loader's global step: batch_size x canonical_replicas
    assert per_step[0] == [12, 4] and per_step[15] == [4, 12]


def test_energon_schedule_batches_identical_at_world_1_2_4(energon_mix):
    path, _ = energon_mix
    ref = energon_steps(path, 1, 14)
    for size in (2, 4):
        assert energon_steps(path, size, 14) == ref


def test_energon_schedule_step_size_keyword_sets_samples_per_step(energon_mix):
    import zephon_energon as ze

    path, _ = energon_mix
    wc = ze.WorkerConfig(rank=0, world_size=1, num_workers=0)
    kw = dict(worker_config=wc, batch_size=2, shuffle_buffer_size=None, max_samples_per_sequence=None,
              canonical_replicas=8)
    assert ze.get_train_dataset(path, **kw).plan.source.step_size == 16  # default: one batch per lane
    assert ze.get_train_dataset(path, schedule_step_size=64, **kw).plan.source.step_size == 64
    with pytest.raises(ValueError, match="multiple of canonical_replicas=8"):
        ze.get_train_dataset(path, schedule_step_size=12, **kw)


def test_energon_metadataset_leaves_carry_the_schedule_and_nested_schedules_are_refused(tmp_path, energon_mix):
    import yaml
    from zephon.formats import DataError
    from zephon.formats.energon import load_metadataset

    path, specs = energon_mix
    leaves = load_metadataset(path)
    assert [leaf["weight"] for leaf in leaves] == specs
    root = os.path.dirname(path)
    nested = {"__module__": "megatron.energon", "__class__": "MetadatasetV2", "splits": {"train": {"blend": [
        {"path": os.path.join(root, "a"), "weight": 1}, {"path": path, "weight": 1}]}}}
    p = tmp_path / "outer.yaml"
    p.write_text(yaml.safe_dump(nested))
    with pytest.raises(DataError, match="nested blend is not supported"):
        load_metadataset(str(p))
    bad = {"__module__": "megatron.energon", "__class__": "MetadatasetV2", "splits": {"train": {"blend": [
        {"path": os.path.join(root, "a"), "weight": {"cosine": {0: 1}}}]}}}
    p.write_text(yaml.safe_dump(bad))
    with pytest.raises(DataError, match=r"blend\[0\]\.weight: a weight schedule is"):
        load_metadataset(str(p))


# ------------------------------------------------------------------------------------------ Mosaic streaming

@pytest.fixture(scope="module")
def stream_dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp("sched_streaming")
    out = []
    for name, offset, n in (("a", 0, 300), ("b", 10_000, 200)):
        d = root / name / "train"
        d.mkdir(parents=True)
        with open(d / "part-0.jsonl", "w") as f:
            for i in range(n):
                f.write(json.dumps({"id": offset + i, "text": f"{name} {i}"}) + "\n")
        out.append(str(root / name))
    return out


STREAM_SPECS = [{"linear": {0: 1, 15: 0}}, {"linear": {0: 0, 15: 1}}]  # a hands over to b over 15 steps


def streaming_steps(dirs, size, epochs=2, gbs=16, epoch_size=160):
    from zephon_streaming import Stream, StreamingDataset

    ranks = []
    for r in range(size):
        with world(r, size):
            ranks.append(StreamingDataset(
                streams=[Stream(local=d, split="train", proportion_schedule=s) for d, s in zip(dirs, STREAM_SPECS)],
                batch_size=gbs // size, epoch_size=epoch_size, shuffle=True, shuffle_seed=5, chunk_size=4))
    out = []
    for _ in range(epochs):
        its = [iter(ds) for ds in ranks]
        for _ in range(epoch_size // gbs):
            out.append([int(next(it)["id"]) for it in its for _ in range(gbs // size)])
    return out


def test_streaming_proportion_schedule_counts_global_steps_across_epochs(stream_dirs):
    steps = streaming_steps(stream_dirs, 1)
    per_step = [[sum(i < 10_000 for i in ids), sum(i >= 10_000 for i in ids)] for ids in steps]
    check_against_integral(per_step[:10], STREAM_SPECS, gbs=16)  # epoch 0: global steps 0-9
    check_against_integral(per_step[10:], STREAM_SPECS, gbs=16, first_step=10)  # epoch 1 continues at step 10
    assert per_step[0] == [16, 0] and per_step[19] == [0, 16]


def test_streaming_proportion_schedule_identical_at_world_2(stream_dirs):
    assert streaming_steps(stream_dirs, 2) == streaming_steps(stream_dirs, 1)


def test_streaming_proportion_schedule_keywords_are_checked(stream_dirs):
    from zephon_streaming import Stream

    with pytest.raises(ValueError, match=r"at most one of proportion, repeat and choose \(or proportion_schedule\)"):
        Stream(local=stream_dirs[0], proportion=1, proportion_schedule={"step": {0: 1}})
    with pytest.raises(ValueError, match="proportion_schedule"):
        Stream(local=stream_dirs[0], proportion_schedule={"cosine": {0: 1}})


# ------------------------------------------------------------------------------------------ zephon verify

CLI_SMALL = ["--canonical-replicas", "8", "--dp", "4", "--resume-dp", "2,8", "--checkpoint-step", "5", "--steps", "10",
             "--max-length", "128", "--no-progress", "--workers", "1", "--runner", "inline"]


def _ramp_schedule(tmp_path):
    sched = tmp_path / "curriculum.yaml"
    sched.write_text("- linear: {0: 9, 3: 9, 8: 1}\n- linear: {0: 1, 3: 1, 8: 9}\n")  # checkpoint 5: in the ramp
    return sched


@pytest.mark.slow  # covered: test_schedule's resume inside the ramp at another dp (the same check, in process)
def test_verify_with_a_schedule_file_passes(corpus, tokenizer_path, tmp_path, capsys):
    from zephon.cli import main

    out_json = tmp_path / "report.json"
    sched = _ramp_schedule(tmp_path)
    rc = main(["verify", "--data", corpus["docs_jsonl"], "--data", corpus["code_jsonl"], "--schedule", str(sched),
               "--tokenizer", tokenizer_path, *CLI_SMALL, "--output-json", str(out_json)])
    out = capsys.readouterr().out
    assert rc == 0, out
    assert "OK: all 10 steps" in out and json.loads(out_json.read_text())["mismatches"] == []


def test_verify_with_a_schedule_file_refuses_what_does_not_fit(corpus, tokenizer_path, tmp_path, capsys):
    from zephon.cli import main

    sched = _ramp_schedule(tmp_path)
    with_weights = main(["verify", "--data", corpus["docs_jsonl"], "--data", corpus["code_jsonl"], "--schedule",
                         str(sched), "--weights", "1,1", "--tokenizer", tokenizer_path, *CLI_SMALL])
    assert with_weights != 0 and "--schedule replaces --weights" in capsys.readouterr().err
    one = tmp_path / "one.json"
    one.write_text(json.dumps({"weights": [1]}))
    rc = main(["verify", "--data", corpus["docs_jsonl"], "--data", corpus["code_jsonl"], "--schedule", str(one),
               "--tokenizer", tokenizer_path, *CLI_SMALL])
    assert rc != 0 and "a schedule of 1 datasets for 2 --data paths" in capsys.readouterr().err
