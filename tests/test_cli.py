"""The `zephon` command: verify (pass and fail), inspect, errors as exit codes."""
from __future__ import annotations

import itertools
import json
import os
import re

import pytest

from zephon.cli import main
from zephon.verify import elastic_verify, format_table

from helpers import make_loader

SMALL = ["--canonical-replicas", "8", "--dp", "4", "--resume-dp", "2,8", "--checkpoint-step", "3", "--steps", "6",
         "--max-length", "128", "--no-progress", "--workers", "1"]


def test_verify_passes_on_jsonl_mixture_with_runner_and_micro_batch_change(corpus, tokenizer_path, capsys, tmp_path):
    out_json = tmp_path / "digests.json"
    rc = main(["verify", "--data", corpus["docs_jsonl"], "--data", corpus["code_jsonl"], "--weights", "0.7,0.3",
               "--tokenizer", tokenizer_path, *SMALL, "--micro-batch", "2", "--resume-micro-batch", "1",
               "--resume-runner", "processes", "--output-json", str(out_json)])
    out = capsys.readouterr().out
    assert rc == 0, out
    assert "OK: all 6 steps" in out and "MISMATCH" not in out
    report = json.loads(out_json.read_text())
    assert len(report["reference"]) == 6 and report["mismatches"] == []
    assert all(report["runs"]["resume dp=8"][s] == report["reference"][s] for s in ("3", "4", "5"))


def test_verify_passes_with_token_level_mixture_correction(corpus, tokenizer_path, capsys):
    rc = main(["verify", "--data", corpus["docs_jsonl"], "--data", corpus["code_jsonl"], "--weights", "1,1",
               "--tokenizer", tokenizer_path, *SMALL, "--ensure-mixture", "--runner", "inline"])
    assert rc == 0, capsys.readouterr().out


@pytest.mark.slow  # covered: test_remote_hosts' verify on a Parquet + JSONL bucket, test_engine's parquet == jsonl
def test_verify_passes_on_parquet(corpus, tokenizer_path, capsys):
    rc = main(["verify", "--data", corpus["docs_parquet"], "--data", corpus["code_parquet"], "--weights", "1,1",
               "--tokenizer", tokenizer_path, *SMALL, "--runner", "inline"])
    assert rc == 0, capsys.readouterr().out


_calls = itertools.count()


def _nondeterministic(record):
    record["text"] = f"{next(_calls)} {record['text']}"
    return record


def test_verify_reports_the_first_differing_step(corpus, tokenizer_path):
    """The checker must be able to fail: a Map that depends on call order breaks determinism."""
    from zephon.ops import Map

    def make(dp, rank, micro_batch, runner):
        return make_loader([corpus["docs_jsonl"]], tokenizer_path, dp=dp, rank=rank, micro_batch=micro_batch,
                           runner=runner, extra_ops=[Map(_nondeterministic)])

    report = elastic_verify(make, dp=2, resume_dps=[4], checkpoint_step=2, steps=4, runner="inline")
    assert report["mismatches"] and report["mismatches"][0][1] == 0
    assert "MISMATCH" in format_table(report)


def test_verify_refuses_a_dp_that_does_not_divide(corpus, tokenizer_path, capsys):
    rc = main(["verify", "--data", corpus["docs_jsonl"], "--tokenizer", tokenizer_path, *SMALL[:4],
               "--resume-dp", "3", "--checkpoint-step", "1", "--steps", "2", "--no-progress"])
    assert rc == 2
    assert "dp_degree=3 does not divide canonical_replicas=8" in capsys.readouterr().err


def test_inspect_lists_shards_counts_and_columns(corpus, capsys):
    assert main(["inspect", corpus["docs_parquet"]]) == 0
    out = capsys.readouterr().out
    assert "format parquet, 3 shards" in out and "columns: text, id" in out
    assert main(["inspect", corpus["code_jsonl"], "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    lines = sum(1 for k in range(3) for _ in open(f"{corpus['code_jsonl']}/part-{k}.jsonl"))
    assert info["num_samples"] == lines and info["num_shards"] == 3


def test_inspect_shows_when_files_disagree_on_columns(tmp_path, capsys):
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"text": ["a"], "id": [1]}), tmp_path / "a.parquet")
    pq.write_table(pa.table({"content": ["b"]}), tmp_path / "b.parquet")
    assert main(["inspect", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "columns: \n" in out or "columns: " + "\n" in out
    assert "b.parquet  parquet  1 samples  " in out and "columns: content" in out


def test_bad_arguments_are_one_line_errors_with_exit_2(corpus, tokenizer_path, capsys):
    import pytest

    base = ["verify", "--data", corpus["docs_jsonl"], "--tokenizer", tokenizer_path, "--no-progress"]
    for extra, message in ((["--weights", "abc"], "--weights takes comma-separated numbers"),
                           (["--weights", "1,2"], "2 --weights for 1 --data paths"),
                           (["--resume-dp", "1,,4"], "--resume-dp takes comma-separated numbers"),
                           (["--eos-token", "<nope>"], "not in the tokenizer's vocabulary"),
                           (["--global-batch-size", "6", "--canonical-replicas", "4", "--dp", "2", "--resume-dp", "1"],
                            "not a multiple"),
                           (["--resume-dp", "0"], "dp_degree=0 does not divide"),
                           (["--output-json", "/nonexistent/dir/x.json"], "does not exist")):
        assert main(base + extra) == 2
        assert message in capsys.readouterr().err
    assert main(["verify", "--data", corpus["docs_jsonl"], "--tokenizer", "nope.json", "--no-progress"]) == 2
    assert "nope.json" in capsys.readouterr().err
    not_a_tokenizer = f"{corpus['docs_jsonl']}/part-0.jsonl"
    assert main(["verify", "--data", corpus["docs_jsonl"], "--tokenizer", not_a_tokenizer, "--no-progress"]) == 2
    assert "is not a tokenizers JSON file" in capsys.readouterr().err
    with pytest.raises(SystemExit) as e:
        main(base + ["--workers", "0"])
    assert e.value.code == 2 and "must be >= 1" in capsys.readouterr().err
    with pytest.raises(SystemExit) as e:
        main(base + ["--checkpoint-step", "5", "--steps", "5"])
    assert e.value.code == 2 and "need 0 < --checkpoint-step (5) < --steps (5)" in capsys.readouterr().err


# -- verify on every format with its own options (issue 15, item 7) -------------------------------------------


def _energon_text_root(d, stdlib_texts):
    """TextSample dataset (field_map text: txt) of real documents, prepared by the real `energon prepare` CLI."""
    import webdataset as wds

    import energon_data as E

    root = os.path.join(d, "etext")
    os.makedirs(root)
    docs = stdlib_texts[0][:240]
    with wds.ShardWriter(os.path.join(root, "part-%03d.tar"), maxcount=60, verbose=0) as w:
        for i, t in enumerate(docs):
            w.write({"__key__": f"d{i:05d}", "txt": t, "json": {"i": i}})
    E.energon_prepare_cli(root, {"train": r".*"}, sample_type="TextSample", field_map={"text": "txt"})
    return root, docs


def test_verify_passes_on_an_energon_dataset_with_its_split_and_part_filter(tmp_path, stdlib_texts, tokenizer_path,
                                                                            capsys):
    """Failed on main: verify passed columns=['text'], which Energon datasets refuse."""
    pytest.importorskip("megatron.energon")
    root, _ = _energon_text_root(str(tmp_path), stdlib_texts)
    for extra in (["--format", "energon", "--split", "train"], ["--part-filter", "txt", "--field", "txt"]):
        rc = main(["verify", "--data", root, "--tokenizer", tokenizer_path, *SMALL, "--runner", "inline", *extra])
        out = capsys.readouterr().out
        assert rc == 0, out
        assert "OK: all 6 steps" in out


def test_verify_reads_the_energon_text_it_was_given(tmp_path, stdlib_texts, tokenizer_path, monkeypatch):
    """The text reaching the tokenizer is the sample's txt part: every document piece of the first packed row
    decodes to text found in the documents written (oracle: the documents themselves)."""
    pytest.importorskip("megatron.energon")
    from tokenizers import Tokenizer, decoders

    import zephon.cli as cli
    import zephon.cli_pipeline as cli_pipeline

    root, docs = _energon_text_root(str(tmp_path), stdlib_texts)
    seen = {}
    monkeypatch.setattr(cli, "cmd_verify", lambda a: seen.setdefault("args", a) and 0)
    main(["verify", "--data", root, "--tokenizer", tokenizer_path, *SMALL])
    datasets, make_loader = cli_pipeline.build_pipeline(seen["args"], tokenizer_path)
    assert datasets[0].num_samples == len(docs)
    mb = next(iter(make_loader(1, 0, 1, "inline")))
    ids = [int(t) for t in mb["input_ids"][0][mb["attention_mask"][0].astype(bool)]]
    tok = Tokenizer.from_file(tokenizer_path)
    tok.decoder = decoders.ByteLevel()  # the fixture's tokenizer has none: bytes back from byte-level tokens
    eos = tok.token_to_id("<eos>")
    pieces, cur = [], []
    for t in ids:  # documents (or pieces of long ones) are separated by <eos>
        if t == eos:
            pieces.append(cur)
            cur = []
        else:
            cur.append(t)
    texts = [tok.decode(p)[4:-4] for p in pieces + [cur]]  # ends may hold half a character
    texts = [t for t in texts if len(t) > 20]
    assert texts and all(any(t in d for d in docs) for t in texts)


def _mds_texts(out, texts):
    from streaming import MDSWriter

    with MDSWriter(out=str(out), columns={"text": "str", "id": "int"}, size_limit=1 << 16,
                   compression="zstd") as w:
        for i, t in enumerate(texts):
            w.write({"text": t, "id": i})
    return str(out)


@pytest.mark.slow  # covered: test_remote_hosts' verify at S3, test_remote_formats' MDS at S3 == local (split)
def test_verify_passes_on_mds_with_a_split_and_at_s3(tmp_path, stdlib_texts, tokenizer_path, s3, capsys):
    pytest.importorskip("streaming")
    root = tmp_path / "root"
    _mds_texts(root / "train", stdlib_texts[0][:400])
    _mds_texts(tmp_path / "code" / "train", stdlib_texts[1][:300])  # format flags apply to every --data
    rc = main(["verify", "--data", str(root), "--data", str(tmp_path / "code"), "--weights", "0.6,0.4",
               "--split", "train", "--tokenizer", tokenizer_path, *SMALL, "--runner", "inline",
               "--cache-dir", str(tmp_path / "cache")])
    out, err = capsys.readouterr()
    assert rc == 0 and "OK: all 6 steps" in out, err
    url = s3.upload_dir(str(root), "root")
    rc = main(["verify", "--data", url, "--split", "train", "--format", "mds", "--tokenizer", tokenizer_path, *SMALL,
               "--runner", "inline", "--local", str(tmp_path / "local"), "--download-retry", "1"])
    out, err = capsys.readouterr()
    assert rc == 0 and "OK: all 6 steps" in out, err
    assert os.listdir(tmp_path / "local")  # read through the remote cache


def test_verify_refuses_another_formats_option_naming_it(corpus, tokenizer_path, capsys):
    rc = main(["verify", "--data", corpus["docs_jsonl"], "--tokenizer", tokenizer_path, *SMALL,
               "--part-filter", "txt"])
    assert rc == 2
    assert "part_filter applies to Energon datasets only (format='energon')" in capsys.readouterr().err


# -- messages (issue 15, item 8) -----------------------------------------------------------------------------


def test_unknown_eos_token_says_to_pass_eos_token_and_which(corpus, tmp_path, capsys):
    """Failed on main: the message did not mention --eos-token."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.train_from_iterator(["some text to learn from"] * 5,
                            trainers.BpeTrainer(vocab_size=300, special_tokens=["</s>", "<unk>"], show_progress=False))
    path = str(tmp_path / "tok.json")
    tok.save(path)
    base = ["verify", "--data", corpus["docs_jsonl"], "--tokenizer", path, *SMALL, "--runner", "inline"]
    assert main(base) == 2
    err = capsys.readouterr().err
    assert "--eos-token '<eos>'" in err and "not in the tokenizer's vocabulary" in err
    assert "Pass --eos-token with this tokenizer's end-of-document token" in err
    assert "e.g. --eos-token '</s>'" in err
    assert main(base + ["--eos-token", "</s>"]) == 0
    capsys.readouterr()
    assert main(base + ["--eos-token", str(tok.token_to_id("</s>"))]) == 0  # an id works too
    assert "OK: all 6 steps" in capsys.readouterr().out


def test_new_users_verify_mistakes_get_one_line_errors_naming_the_flag(corpus, tokenizer_path, tmp_path, capsys):
    """Found by a new user: a malformed --schedule file gave a YAML traceback; --schedule with --weights blamed
    --ensure-mixture; the default --dp 16 on 8 lanes failed without naming --dp or its default; the suggested
    --eos-token was the first special token ('<pad>') rather than the end-of-document one."""
    base = ["verify", "--data", corpus["docs_jsonl"], "--data", corpus["code_jsonl"], "--tokenizer", tokenizer_path,
            *SMALL]
    bad = tmp_path / "bad.yaml"
    bad.write_text("- linear: {0: 9, 4: 9\n- [oops\n")
    assert main(base + ["--schedule", str(bad)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("zephon: error:") and "bad.yaml" in err and "not a valid YAML/JSON schedule" in err
    good = tmp_path / "good.yaml"
    good.write_text("- 1\n- 1\n")
    assert main(base + ["--schedule", str(good), "--weights", "1,2"]) == 2
    err = capsys.readouterr().err
    assert "cannot be combined with --weights" in err and "--ensure-mixture" not in err
    assert main(["verify", "--data", corpus["docs_jsonl"], "--tokenizer", tokenizer_path, "--canonical-replicas", "8",
                 "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert "--dp 16" in err and "--dp defaults to 16" in err and "--micro-batch 1" in err
    from zephon.cli_pipeline import special_tokens as _special_tokens
    assert _special_tokens(tokenizer_path).endswith("e.g. --eos-token '<eos>'")  # not '<pad>', listed first


def test_explain_help_lists_only_the_flags_explain_uses(capsys):
    """explain and diff replay from a checkpoint: verify's run flags (resume, steps, runner, table) are not theirs,
    while the pipeline flags they do use stay."""
    verify_only = ("--resume-dp", "--checkpoint-step", "--steps", "--resume-runner", "--resume-workers",
                   "--resume-micro-batch", "--runner", "--output-json", "--table-rows")
    for cmd in ("explain", "diff"):
        with pytest.raises(SystemExit):
            main([cmd, "--help"])
        out = capsys.readouterr().out
        assert not [f for f in verify_only if re.search(rf"{f}\b", out)], out
        assert all(f in out for f in ("--chunk-size", "--shuffle-buffer", "--max-length", "--checkpoint"))
    with pytest.raises(SystemExit):
        main(["verify", "--help"])
    out = capsys.readouterr().out
    assert all(f in out for f in verify_only)


def test_checkpoint_step_0_refusal_points_to_the_api(capsys):
    with pytest.raises(SystemExit) as e:
        main(["verify", "--data", "x", "--checkpoint-step", "0"])
    err = capsys.readouterr().err
    assert e.value.code == 2 and "need 0 < --checkpoint-step (0)" in err and "step-0 checkpoint" in err
