"""scripts/megatron_gpt_resume.py (a tiny GPT pretrain() on a GPU, checked across a resume): its ``--dry-run``
prints the commands the GPU check runs; here they are parsed and checked against the issue's requirements."""
from __future__ import annotations

import os
import shlex
import subprocess
import sys

SCRIPT = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "scripts", "megatron_gpt_resume.py")


def _flag(argv, name):
    return argv[argv.index(name) + 1] if name in argv else None


def test_dry_run_prints_a_dp1_external_loader_run_and_its_resume(tmp_path):
    out = subprocess.run([sys.executable, SCRIPT, "--dry-run", "--workdir", str(tmp_path / "w")],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    cmds = [shlex.split(line) for line in out.stdout.splitlines() if line and not line.startswith("#")]
    assert len(cmds) == 3 and not os.path.exists(tmp_path / "w")  # prepare, run A, run B; nothing made
    prepare, run_a, run_b = cmds
    assert prepare[0].endswith("energon") and prepare[1] == "prepare" and "TextSample" in prepare
    for run in (run_a, run_b):
        assert run[1:3] == ["-m", "torch.distributed.run"] and _flag(run, "--nproc-per-node") == "1"  # dp 1
        assert _flag(run, "--dataloader-type") == "external" and _flag(run, "--transformer-impl") == "local"
        assert _flag(run, "--dataloader-save") and _flag(run, "--save") and "--train" in run
        assert _flag(run, "--data-path") == prepare[-1]
    assert "--load" not in run_a and _flag(run_b, "--load") == _flag(run_a, "--save")
    # Run B is run A plus --load: same model, data and save interval; its own key log.
    assert _flag(run_b, "--ckpt-step") == _flag(run_a, "--save-interval")  # resume from the mid-run checkpoint
    strip = {"--load", _flag(run_b, "--load"), "--ckpt-step", _flag(run_b, "--ckpt-step"), _flag(run_a, "--keys-log"),
             _flag(run_b, "--keys-log")}
    assert [x for x in run_a if x not in strip] == [x for x in run_b if x not in strip]
    assert int(_flag(run_a, "--save-interval")) < int(_flag(run_a, "--train-iters"))  # a checkpoint mid-run
