"""``python -m benchmarks --only loss [--quick] [--no-write] [--results JSON]``: the loss-curve experiment.

Prepares the data (``data.prepare``), runs every loader's two experiments in its own child process
(``python -m benchmarks.child loss.peer``; ``jobs`` at a time, default 2: one core each, the arithmetic
does not depend on it), then the real-DDP check, prints the tables and (full run, unless ``--no-write``)
writes docs/loss-curves.md (between its markers) and docs/img/loss-*.png. Prints only; asserts nothing.
Full run: 4,600 training steps of about 0.15 s each (12 minutes of one core) plus loader start-up and the
DDP check; 18-29 minutes measured on a shared 2-core machine (load average 2-7). ``--quick``: a few steps
of a tiny model, about 2 minutes (most of it the DDP check's process start-up).
"""
from __future__ import annotations

import json
import os
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict
from pathlib import Path

from ..common import REPO, core_digest, machine, run_child
from .experiment import FULL, QUICK, Settings, run_peer


def log(msg: str) -> None:
    print(msg, flush=True)


def _settings(cfg: dict) -> Settings:
    from .model import ModelConfig

    return Settings(**dict(cfg, model=ModelConfig(**cfg["model"])))


def child_peer(cfg: dict) -> dict:
    """In a child process: both experiments for ``cfg["name"]`` (``cfg``: name, m, settings)."""
    core = core_digest()  # before the first import of zephon in this process
    from .data import heldout
    from .model import setup_torch

    os.environ["TQDM_DISABLE"] = "1"  # Energon's buffer progress bars
    setup_torch()
    s = _settings(cfg["settings"])
    lines = []
    res = run_peer(cfg["name"], cfg["m"], s, heldout(cfg["m"]), log=lines.append)
    res["log"], res["core"] = lines, core
    return res


def git_state() -> dict:
    """``git rev-parse HEAD`` and ``git status --short`` of the repository at run time (read-only)."""
    def git(*a):
        try:
            return subprocess.run(["git", *a], cwd=str(REPO), capture_output=True, text=True, timeout=20).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            return None
    status = git("status", "--short")
    return {"head": git("rev-parse", "HEAD"), "status": status.splitlines() if status else []}


def run(quick: bool = False, jobs: int = 2, peers=None, ddp: bool = True, workdir: str | None = None) -> dict:
    """Run everything; returns the results (plain data).

    Args:
        quick: ``experiment.QUICK`` instead of ``FULL``; jobs: loaders run at once (child processes);
        peers: loaders to run (default all); ddp: run the real-DDP check; workdir: demo workdir (corpus cache).
    """
    from zephon.demo_corpus import default_workdir

    from . import data
    from .model import TinyLM, n_params

    t0 = time.perf_counter()
    s = QUICK if quick else FULL
    if peers:
        s = Settings(**dict(asdict(s), model=s.model, peers=tuple(peers)))
    R = {"machine": machine(), "git_before": git_state(), "core_before": core_digest(), "quick": quick,
         "settings": asdict(s), "jobs": jobs}
    from importlib import metadata

    for dist in ("torchtitan", "datasets"):  # the peers machine() does not list
        try:
            R["machine"]["versions"][dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            R["machine"]["versions"][dist] = None
    log(f"# loss curves ({'quick' if quick else 'full'}): {R['machine']['date']}, nproc={R['machine']['nproc']}, "
        f"load {R['machine']['load_before']:.2f}, HEAD {R['git_before']['head']}, "
        f"{len(R['git_before']['status'])} uncommitted paths")
    m = data.prepare(workdir or default_workdir(), s.model.vocab, s.model.seq_len, s.heldout_rows, log=log)
    for name in s.peers:  # build the peers' own formats once, before the children start in parallel
        if name == "streaming":
            data.mds_rows(m)
        elif name == "energon":
            data.energon_wds(m)
    R["train_docs"] = m["train_docs"]
    R["params"] = n_params(TinyLM(s.model))
    cfg = {"m": m, "settings": asdict(s)}
    env = {"TQDM_DISABLE": "1", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}

    def one(name):
        t = time.perf_counter()
        res = run_child("loss.peer", dict(cfg, name=name), timeout=3600, env_extra=env, log=log)
        for line in (res or {}).get("log", []):
            log(line)
        log(f"## {name}: {time.perf_counter() - t:.0f} s" + (f" FAILED {res.get('error')}" if "error" in res else ""))
        if res and "error" not in res:
            res["wall_seconds"] = time.perf_counter() - t
        return name, res

    with ThreadPoolExecutor(max(1, jobs)) as ex:
        R["peers"] = dict(ex.map(one, s.peers))
    if ddp:
        from .ddp import check

        t = time.perf_counter()
        R["ddp"] = check([n for n in ("zephon", "sampler") if n in s.peers], m, s, log=log)
        R["ddp_seconds"] = time.perf_counter() - t
        log(f"## ddp check: {R['ddp_seconds']:.0f} s")
    R["git_after"], R["core_after"] = git_state(), core_digest()
    R["seconds"] = time.perf_counter() - t0
    R["load_after"] = os.getloadavg()[0]
    return R


def main(quick: bool = False, write: bool = True, results: str | None = None, from_results: str | None = None,
         jobs: int = 2, workdir: str | None = None) -> int:
    """Entry point of ``python -m benchmarks --only loss``; returns the exit status (0 unless a peer failed)."""
    from .report import render, write_doc

    if from_results:
        R = json.loads(Path(from_results).read_text())
    else:
        R = run(quick=quick, jobs=jobs, workdir=workdir)
        if results:
            Path(results).write_text(json.dumps(R, indent=1, default=str))
    md = render(R, img_dir=REPO / "docs" / "img", write_plots=write)
    print()
    print(md)
    if write:
        write_doc(REPO / "docs" / "loss-curves.md", md)
        log("wrote docs/loss-curves.md and docs/img/loss-*.png")
    log(f"total {R['seconds']:.0f} s")
    return 1 if any(not r or "error" in r for r in R["peers"].values()) else 0
