"""Run a training script under Composer's own launcher (``python -m composer.cli -n N``, gloo on CPU) and read the
``rank{RANK}.json`` every rank writes; plus what the Composer and llm-foundry jobs and tests share (the job's
command line, the Trainer's end-of-run record, the ranks' steps side by side)."""
from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

LAUNCH_TIMEOUT = 240


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(job: Path, nproc: int, tmp: Path, *args: str, env: dict | None = None,
           timeout: float = LAUNCH_TIMEOUT) -> list[dict]:
    """``python -m composer.cli -n nproc job args --out tmp/out``; returns the ranks' records in rank order.

    job: the script. nproc: ranks. tmp: a fresh directory for results and logs. env: extra environment variables.
    Kills the launcher's process group after ``timeout`` seconds; fails the test showing every rank's output when
    the launcher exits non-zero, times out or a rank wrote no result."""
    out, logs = tmp / "out", tmp / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    clean = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK",
                                                               "LOCAL_WORLD_SIZE", "NODE_RANK", "MASTER_PORT")}
    clean.update(OMP_NUM_THREADS="1", PYTHONWARNINGS="ignore::DeprecationWarning", **(env or {}))
    # the module, not a `composer` script next to the interpreter: a layered environment (manifest `base`) has
    # Composer's packages but not its scripts
    cmd = [sys.executable, "-m", "composer.cli", "-n", str(nproc), "--master_port", str(free_port()),
           "--stdout", str(logs / "rank{rank}.stdout.txt"), "--stderr", str(logs / "rank{rank}.stderr.txt"),
           str(job), *args, "--out", str(out)]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=clean,
                            start_new_session=True)
    try:
        text, _ = proc.communicate(timeout=timeout)
        failed = f"exit code {proc.returncode}" if proc.returncode else None
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        text, _ = proc.communicate()
        failed = f"timeout after {timeout} s"
    results = [out / f"rank{r}.json" for r in range(nproc)]
    if failed is None and not all(p.is_file() for p in results):
        failed = "a rank wrote no result"
    if failed:
        ranks = "".join(f"\n--- {p.name} ---\n{p.read_text()[-4000:]}" for p in sorted(logs.iterdir()))
        pytest.fail(f"{' '.join(cmd)}\n{failed}\n--- launcher and rank 0 ---\n{text[-6000:]}{ranks}", pytrace=False)
    return [json.loads(p.read_text()) for p in results]


def write_result(out: str, result: dict) -> None:
    """Write ``result`` as ``out/rank{RANK}.json`` atomically (what ``launch`` reads)."""
    os.makedirs(out, exist_ok=True)
    path = os.path.join(out, f"rank{os.environ.get('RANK', '0')}.json")
    with open(path + ".tmp", "w") as f:
        json.dump(result, f)
    os.replace(path + ".tmp", path)


def job_arguments(description: str) -> argparse.ArgumentParser:
    """The command line both jobs take (more may be added): data, per-device batch, duration, workers, checkpoints."""
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--data", required=True)
    p.add_argument("--batch-size", type=int, required=True, help="per device")
    p.add_argument("--max-duration", required=True)
    p.add_argument("--workers", type=int, default=0)
    p.add_argument("--save-folder")
    p.add_argument("--save-interval")
    p.add_argument("--load-path")
    p.add_argument("--out", required=True, help="directory: each rank writes rank{RANK}.json")
    return p


def finish(trainer, dataset, save_folder: str | None) -> dict:
    """Close a fitted ``trainer`` and ``dataset``; returns ``dataset_resumption``, the ``final`` timestamp (epoch,
    batch, sample) and the ``checkpoints`` written to ``save_folder`` (file names, ``latest`` links left out)."""
    ts = trainer.state.timestamp
    out = {"dataset_resumption": dict(trainer.state.dataset_resumption),
           "final": {"epoch": int(ts.epoch), "batch": int(ts.batch), "sample": int(ts.sample)},
           "checkpoints": sorted(n for n in os.listdir(save_folder) if not n.startswith("latest"))
           if save_folder and os.path.isdir(save_folder) else []}
    trainer.close()
    dataset.close()
    return out


def steps_side_by_side(ranks: list[dict]) -> list[list[dict]]:
    """Per step, the ranks' step records in rank order. Fails when the ranks ran different steps."""
    n = len(ranks[0]["steps"])
    assert all(len(r["steps"]) == n for r in ranks), "ranks ran different numbers of steps"
    out = []
    for i in range(n):
        steps = [r["steps"][i] for r in ranks]
        assert len({s["batch"] for s in steps}) == 1, f"ranks at different batches: {[s['batch'] for s in steps]}"
        out.append(steps)
    return out
