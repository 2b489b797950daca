"""The `zephon` command: verify (pass and fail), inspect, errors as exit codes."""
from __future__ import annotations

import itertools
import json

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
