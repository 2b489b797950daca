"""Launch TorchTitan's Trainer with ``torchrun`` and read back the global batches it trained on.

Used by tests/test_titan_trainer.py, by the elastic experiment (``elastic``) and its GPU script
(scripts/titan_elastic.sh). A run is ``torchrun --standalone --nproc_per_node W -m benchmarks.titan.train``
with TorchTitan's own arguments; ``train`` logs the batches, ``global_batches`` joins them.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import defaultdict

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def cpu_parallelism(world: int) -> list[str]:
    """TorchTitan arguments for gloo: DDP over ``world`` ranks (FSDP's reduce-scatter needs PREMUL_SUM,
    which gloo lacks)."""
    return ["--parallelism.data_parallel_replicate_degree", str(world),
            "--parallelism.data_parallel_shard_degree", "1"]


def torchrun(world: int, args: list[str], *, digests: str | None = None, cpu: bool = False, log: str,
             timeout: float = 900, env: dict | None = None) -> int:
    """Run TorchTitan's Trainer on ``world`` local processes; returns torchrun's exit code.

    world: processes (ranks) on this machine
    args: torchtitan.train arguments (``--module ... --config ... --training.steps ...``)
    digests: directory for the per-rank batch logs (``train.log_batches``), or None
    cpu: apply ``cpu.patch_for_cpu`` in every rank and run DDP over gloo (``cpu_parallelism``)
    log: file receiving the ranks' stdout and stderr
    timeout: seconds before the run is killed; raises ``TimeoutError`` naming the command and the log.
    """
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={world}",
           "-m", "benchmarks.titan.train"]
    if cpu:
        cmd.append("--cpu")
    if digests:
        cmd += ["--digests", digests]
    cmd += args + (cpu_parallelism(world) if cpu else [])
    full_env = dict(os.environ, **(env or {}))
    path = [REPO, os.path.join(REPO, "adapters")]
    full_env["PYTHONPATH"] = os.pathsep.join(path + [p for p in [full_env.get("PYTHONPATH")] if p])
    full_env.setdefault("OMP_NUM_THREADS", "1")  # ranks share the cores: one thread each
    with open(log, "w") as fh:
        fh.write(" ".join(cmd) + "\n")
        fh.flush()
        proc = subprocess.Popen(cmd, cwd=REPO, env=full_env, stdout=fh, stderr=subprocess.STDOUT,
                                start_new_session=True)
        try:
            return proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, 9)
            proc.wait()
            raise TimeoutError(f"TorchTitan run on {world} ranks still running after {timeout:.0f} s: "
                               f"{' '.join(cmd)} (log {log})") from None


def global_batches(digests: str) -> dict[int, list[str]]:
    """``{step: row digests of the global batch}`` from ``digests``' per-rank logs, dp ranks ascending.
    Raises ``ValueError`` when a step lacks a dp rank or has one twice (a run that did not finish)."""
    by_step: dict[int, dict[int, list[str]]] = defaultdict(dict)
    sizes: dict[int, int] = {}
    for name in sorted(n for n in os.listdir(digests) if n.startswith("rank")):
        with open(os.path.join(digests, name)) as fh:
            for line in fh:
                rec = json.loads(line)
                if rec["dp_rank"] in by_step[rec["step"]]:
                    raise ValueError(f"{digests}/{name}: step {rec['step']} logged twice for dp rank {rec['dp_rank']}")
                by_step[rec["step"]][rec["dp_rank"]] = rec["rows"]
                sizes[rec["step"]] = rec["dp"]
    out = {}
    for step, ranks in sorted(by_step.items()):
        if sorted(ranks) != list(range(sizes[step])):
            raise ValueError(f"{digests}: step {step} has dp ranks {sorted(ranks)} of {sizes[step]}")
        out[step] = [row for r in sorted(ranks) for row in ranks[r]]
    return out


def losses(digests: str) -> dict[int, float]:
    """``{step: TorchTitan's global average loss}`` logged by rank 0 (``train.log_losses``)."""
    with open(os.path.join(digests, "loss.jsonl")) as fh:
        return {rec["step"]: rec["loss"] for rec in map(json.loads, fh)}


def tail(log: str, lines: int = 30) -> str:
    """The last ``lines`` lines of a run's log (for failure messages)."""
    with open(log, errors="replace") as fh:
        return "".join(fh.readlines()[-lines:])
