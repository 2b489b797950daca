"""Hard-link the CUDA runtime wheels of already-built environments into a new one, before pip runs.

Every column installs PyPI's torch, whose CUDA runtime libraries (``nvidia-*``, ``cuda-toolkit``,
``cuda-pathfinder``: ~3 GB, tagged ``py3-none``, so the same files for every CPython) are pinned to exact
versions by torch. Installed once per column they fill a small disk; linked, they cost nothing. pip sees
the linked distributions as installed and keeps them when the version is the one it wants, else it
uninstalls them (which only removes this environment's links) and installs its own.

Hazard, hence opt-in (``ZEPHON_COMPAT_SHARE_WHEELS=1``, see ``envs.build``): a wheel of another CUDA line with
files at the same paths (``nvidia-nccl-cu12`` and ``-cu13`` both write ``nvidia/nccl/lib/libnccl.so.2``) is written
through the link, so a Composer column (torch 2.7, cu12) rewrote the cu13 columns' NCCL: "undefined symbol
ncclCommResume" at ``import torch``. Use it only when every column sharing the links is on one CUDA line.
"""
from __future__ import annotations

import os
import re
from pathlib import Path

# Distributions (dist-info directory names) worth sharing: large, python-independent, exact-pinned by torch.
SHARED = re.compile(r"^(nvidia_[A-Za-z0-9_]+|cuda_toolkit|cuda_pathfinder)-[^-]+\.dist-info$")


def site_packages(venv: Path) -> Path | None:
    """The ``lib/pythonX.Y/site-packages`` directory of a virtual environment, or None."""
    found = sorted(venv.glob("lib/python*/site-packages"))
    return found[0] if found else None


def _python_independent(dist_info: Path) -> bool:
    """True when the wheel's tags (dist-info/WHEEL) are all ``py3-none-*`` / ``py2.py3-none-*``."""
    try:
        tags = [line.split(":", 1)[1].strip() for line in (dist_info / "WHEEL").read_text().splitlines()
                if line.startswith("Tag:")]
    except OSError:
        return False
    return bool(tags) and all(re.match(r"^(py3|py2\.py3)-none-", t) for t in tags)


def _record_files(dist_info: Path) -> list[str]:
    """Paths (relative to site-packages) of a distribution's files, from its RECORD; none outside it."""
    try:
        lines = (dist_info / "RECORD").read_text().splitlines()
    except OSError:
        return []
    paths = [line.rsplit(",", 2)[0] for line in lines if line.strip()]
    return [p for p in paths if not p.startswith(("/", "..")) and "__pycache__" not in p]


def link_shared(root: Path, venv: Path, log=print) -> int:
    """Hard-link every shareable distribution found in a built sibling of ``venv`` under ``root`` into ``venv``.

    root: the directory holding the environments (a sibling counts once its build stamp exists).
    venv: the new environment (created, nothing installed yet).
    Returns the number of distributions linked; a distribution already present in ``venv``, or whose files
    are not all readable, is skipped. Links fail quietly to nothing (another file system): pip then installs."""
    target = site_packages(venv)
    if target is None:
        return 0
    done: set[str] = {d.name.split("-")[0].lower() for d in target.glob("*.dist-info")}
    linked = 0
    for sibling in sorted(p for p in root.iterdir() if p.is_dir() and p != venv):
        sp = site_packages(sibling)
        if sp is None or not (sibling / "zephon-compat-stamp").exists():
            continue
        for dist_info in sorted(sp.glob("*.dist-info")):
            name = dist_info.name.split("-")[0].lower()
            if name in done or not SHARED.match(dist_info.name) or not _python_independent(dist_info):
                continue
            files = _record_files(dist_info)
            if not files or not all((sp / f).is_file() for f in files):
                continue
            made = []
            try:
                for f in files:
                    dst = target / f
                    dst.parent.mkdir(parents=True, exist_ok=True)
                    os.link(sp / f, dst)
                    made.append(dst)
            except OSError:  # another file system or a clash: undo, let pip install it
                for m in made:
                    m.unlink(missing_ok=True)
                continue
            done.add(name)
            linked += 1
    if linked:
        log(f"[{venv.name}] linked {linked} CUDA runtime distributions from sibling environments (hard links)")
    return linked
