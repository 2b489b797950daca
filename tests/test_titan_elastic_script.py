"""The GPU script of the launch experiment (scripts/titan_elastic.sh): its plan and its ``--dry-run`` on CPU."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

pytest.importorskip("torchtitan.trainer", reason="torchtitan not installed: the script drives its Trainer")

from benchmarks.titan import elastic  # noqa: E402

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def opts(corpus, tokenizer_path, *more):
    return elastic.parse(["--dataset-path", f"{corpus['docs_jsonl']},{corpus['code_jsonl']}", "--weights", "0.7",
                          "0.3", "--hf-assets-path", os.path.dirname(tokenizer_path), *more])


@pytest.mark.contract("torchtitan.trainer.launch")
def test_plan_has_the_launch_shape_and_places_ranks(corpus, tokenizer_path):
    """Default plan: 16 ranks to step 200 checkpointing at 150, then 8, 32 and 64 from that checkpoint;
    with 8 GPUs the 8-rank runs use them and the others are simulated on CPU."""
    runs = elastic.plan(opts(corpus, tokenizer_path), gpus=8)
    assert [(r.name, r.dp, r.device, r.load, r.load_step) for r in runs] == [
        ("full-dp16", 16, "cpu", None, 0), ("resume-dp8", 8, "gpu", "full-dp16", 150),
        ("resume-dp32", 32, "cpu", "full-dp16", 150), ("resume-dp64", 64, "cpu", "full-dp16", 150)]
    full = runs[0].args
    assert full[full.index("--checkpoint.interval") + 1] == "150" and full[full.index("--training.steps") + 1] == "200"
    assert [r.args[r.args.index("--training.local_batch_size") + 1] for r in runs] == ["4", "8", "2", "1"]
    with pytest.raises(ValueError, match=r"not a multiple of dp \[48\]"):
        elastic.plan(opts(corpus, tokenizer_path, "--resume-dp", "8", "48"), gpus=0)


@pytest.mark.contract("torchtitan.trainer.launch")
def test_dry_run_on_cpu(corpus, tokenizer_path, tmp_path):
    """``bash scripts/titan_elastic.sh --dry-run`` on a machine without GPUs: each run's TorchTitan config
    parses and rank 0's loader yields [global batch / dp, seq_len] over its 64 / dp lanes."""
    cmd = ["bash", os.path.join(REPO, "scripts", "titan_elastic.sh"), "--dataset-path",
           f"{corpus['docs_jsonl']},{corpus['code_jsonl']}", "--weights", "0.7", "0.3",
           "--hf-assets-path", os.path.dirname(tokenizer_path), "--seq-len", "64", "--gpus", "0",
           "--out", str(tmp_path), "--dry-run"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=dict(os.environ, PYTHON=sys.executable))
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = [x for x in proc.stdout.splitlines() if x.startswith(("full-", "resume-"))]
    assert len(lines) == 4, proc.stdout
    for line, dp in zip(lines, (16, 8, 32, 64)):
        assert line.startswith(f"{'full' if dp == 16 else 'resume'}-dp{dp}: {dp} ranks on cpu, steps 1-200"), line
        assert f"rank 0 batch [{64 // dp}, 64], lanes 0-{64 // dp - 1} of 64; ZephonTextDataLoader" in line, line
    assert all("resumes full-dp16 step 150" in x for x in lines[1:])
    assert not os.listdir(tmp_path), "a dry run launched something"
