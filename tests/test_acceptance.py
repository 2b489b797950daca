"""The issue's acceptance runs at full size (slow: `python -m pytest -m slow`). The oracle is the
uninterrupted dp=1 reference computed inside `zephon verify`; a mismatch makes it exit 1."""
from __future__ import annotations

import pytest

from zephon.cli import main
from zephon.demo_corpus import build_corpus, build_tokenizer

pytestmark = pytest.mark.slow

FULL = ["--canonical-replicas", "64", "--dp", "16", "--resume-dp", "8,32,64", "--checkpoint-step", "150",
        "--steps", "300", "--max-length", "2048", "--no-progress", "--table-rows", "3"]


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    work = tmp_path_factory.mktemp("demo")
    corpus = build_corpus(work)
    return corpus, build_tokenizer(work, [corpus["source_jsonl"], corpus["docstrings_jsonl"]])


@pytest.mark.parametrize("fmt", ["jsonl", "parquet"])
def test_verify_full_size_mixture(demo, fmt, capsys):
    corpus, tok = demo
    rc = main(["verify", "--data", corpus[f"source_{fmt}"], "--data", corpus[f"docstrings_{fmt}"],
               "--weights", "0.7,0.3", "--tokenizer", tok, *FULL])
    out = capsys.readouterr().out
    assert rc == 0, out
    assert "OK: all 300 steps" in out


def test_verify_full_size_runner_workers_and_micro_batch_change(demo, capsys):
    corpus, tok = demo
    rc = main(["verify", "--data", corpus["source_jsonl"], "--data", corpus["docstrings_jsonl"],
               "--weights", "0.7,0.3", "--tokenizer", tok, *FULL, "--micro-batch", "2", "--global-batch-size", "128",
               "--runner", "threads", "--resume-runner", "processes", "--resume-workers", "1",
               "--resume-micro-batch", "1"])
    assert rc == 0, capsys.readouterr().out
