"""The environments of ``manifest.toml``: parse, build one virtual environment each, run the contract tests.

A built environment carries a stamp (SHA-256 of its manifest entry, the interpreter and pyproject.toml);
a later run reuses it only while the stamp matches, and ``fresh=True`` always rebuilds.
"""
from __future__ import annotations

import glob
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import time
import tomllib
from dataclasses import asdict, dataclass
from pathlib import Path

from .contracts import HOSTS
from .shared_wheels import link_shared

REPO = Path(__file__).resolve().parent.parent
MANIFEST = Path(__file__).resolve().parent / "manifest.toml"
# Packages whose installed versions the matrix reports, in this order.
REPORTED = ["torch", "torchvision", "torchdata", "mosaicml", "mosaicml-streaming", "megatron-energon",
            "webdataset", "torchtitan", "numpy", "pyarrow", "tokenizers"]


class EnvError(RuntimeError):
    """An environment could not be built or its tests could not run; the message says which and why."""


@dataclass(frozen=True)
class EnvSpec:
    name: str
    python: str               # "X.Y"
    install: tuple[str, ...]  # pip arguments, run from the repository root
    hosts: tuple[str, ...]    # contract groups run here
    why: str
    base: str = ""            # an earlier environment whose packages this one sees beneath its own ("": none)


def load_manifest(path: Path = MANIFEST) -> list[EnvSpec]:
    """Parse ``manifest.toml`` into ``EnvSpec``s, in file order.

    Raises ValueError naming the entry and the key for a missing or unknown key, an unknown host or a
    duplicate name."""
    with open(path, "rb") as fh:
        data = tomllib.load(fh)
    specs, keys, optional = [], {"name", "python", "install", "hosts", "why"}, {"base"}
    for k, e in enumerate(data.get("env", [])):
        label = f"{path.name}: env #{k + 1} ({e.get('name', '?')})"
        if not keys <= set(e) <= keys | optional:
            raise ValueError(f"{label}: keys must be {sorted(keys)} (optional: {sorted(optional)}); missing "
                             f"{sorted(keys - set(e))}, unknown {sorted(set(e) - keys - optional)}")
        base = e.get("base", "")
        if base and not any(s.name == base and s.python == e["python"] and not s.base for s in specs):
            raise ValueError(f"{label}: base must name an earlier environment of the same python that has no base "
                             f"itself, got {base!r}")
        # The name becomes a directory that is deleted and rebuilt: a plain, non-empty file name only.
        if not isinstance(e["name"], str) or not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._+-]*", e["name"]):
            raise ValueError(f"{label}: name must be a string of letters, digits and . _ + - "
                             f"(not starting with a dot), got {e['name']!r}")
        if not isinstance(e["python"], str) or not re.fullmatch(r"\d+\.\d+", e["python"]):
            raise ValueError(f"{label}: python must be a quoted \"X.Y\" string, got {e['python']!r}")
        for key in ("install", "hosts"):
            if not isinstance(e[key], list) or not all(isinstance(x, str) and x for x in e[key]) or not e[key]:
                raise ValueError(f"{label}: {key} must be a non-empty list of strings, got {e[key]!r}")
        if not isinstance(e["why"], str):
            raise ValueError(f"{label}: why must be a string")
        bad = [h for h in e["hosts"] if h not in HOSTS]
        if bad:
            raise ValueError(f"{label}: unknown hosts {bad}; known: {sorted(HOSTS)}")
        specs.append(EnvSpec(e["name"], e["python"], tuple(e["install"]), tuple(e["hosts"]), e["why"], base))
    names = [s.name for s in specs]
    if len(set(names)) != len(names):
        raise ValueError(f"{path.name}: duplicate env names in {names}")
    if not specs:
        raise ValueError(f"{path.name}: no [[env]] entries")
    return specs


def find_python(version: str) -> str:
    """Path of a CPython ``version`` ("X.Y") interpreter: ``pythonX.Y`` on PATH, else pyenv's.
    Raises EnvError listing where it looked."""
    here = f"{sys.version_info.major}.{sys.version_info.minor}"
    candidates = [sys.executable] if version == here else []
    candidates += [shutil.which(f"python{version}") or ""]
    candidates += sorted(glob.glob(os.path.expanduser(f"~/.pyenv/versions/{version}.*/bin/python{version}")),
                         reverse=True)
    for c in candidates:
        if not c:
            continue
        try:  # a pyenv shim can exist and still refuse to run
            out = subprocess.run([c, "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
                                 capture_output=True, text=True, timeout=60)
        except OSError:
            continue
        if out.returncode == 0 and out.stdout.strip() == version:
            return c
    raise EnvError(f"no CPython {version}: looked for python{version} on PATH and in ~/.pyenv/versions")


def stamp(spec: EnvSpec, python: str, base_stamp: str = "") -> str:
    h = hashlib.sha256(json.dumps(asdict(spec), sort_keys=True).encode())
    h.update(python.encode())
    h.update((REPO / "pyproject.toml").read_bytes())
    h.update(base_stamp.encode())  # a rebuilt base rebuilds what sits on it
    return h.hexdigest()


def site_packages(venv: Path, version: str) -> Path:
    """The site-packages folder of a venv of CPython ``version`` ("X.Y")."""
    return venv / "lib" / f"python{version}" / "site-packages"


def base_stamp(spec: EnvSpec, root: Path) -> str:
    """The stamp of ``spec.base``'s built environment ("" without a base). Raises EnvError when it is not built:
    ``python -m compat_matrix run`` builds the manifest in order, so a base comes first."""
    if not spec.base:
        return ""
    f = root / spec.base / "zephon-compat-stamp"
    if not f.exists():
        raise EnvError(f"base environment {spec.base!r} is not built in {root}: run `python -m compat_matrix run "
                       f"--env {spec.base} --env {spec.name}`")
    return f.read_text()


def _tail(path: Path, n: int = 2, limit: int = 240) -> str:
    """The last ``n`` meaningful lines of a log, joined, at most ``limit`` characters."""
    noise = ("WARNING: Location", "Looking in links", "Looking in indexes", "[notice]")
    lines = [line.strip() for line in path.read_text(errors="replace").splitlines()
             if line.strip() and not any(x in line for x in noise)]
    text = " | ".join(lines[-n:])
    return text if len(text) <= limit else "…" + text[-limit:]


def build(spec: EnvSpec, root: Path, *, fresh: bool = False, log=print) -> Path:
    """Create (or reuse) ``root/<name>`` and pip-install ``spec.install`` into it, from the repository
    root; "." entries are installed editable so the tests import the working tree.
    Returns the environment's python. Raises EnvError with the last lines of pip's log."""
    python = find_python(spec.python)
    venv = root / spec.name
    want = stamp(spec, python, base_stamp(spec, root))
    stamp_file = venv / "zephon-compat-stamp"
    if not fresh and stamp_file.exists() and stamp_file.read_text() == want:
        log(f"[{spec.name}] reusing {venv} (stamp matches; --fresh rebuilds)")
        return venv / "bin" / "python"
    if venv.exists():
        shutil.rmtree(venv)
    root.mkdir(parents=True, exist_ok=True)
    logfile = root / f"{spec.name}.install.log"
    args = []
    for a in spec.install:
        args += ["-e", a] if a.startswith(".") else [a]
    t0 = time.monotonic()
    with open(logfile, "w") as fh:
        for cmd in ([python, "-m", "venv", str(venv)], [str(venv / "bin" / "python"), "-m", "pip", "install", *args]):
            # Opt-in (ZEPHON_COMPAT_SHARE_WHEELS=1, for a full disk): sharing the CUDA wheels of built siblings by
            # hard link let a column on another CUDA line (composer's cu12) rewrite the shared files of cu13 columns.
            if "pip" in cmd and os.environ.get("ZEPHON_COMPAT_SHARE_WHEELS") == "1":
                link_shared(root, venv, log)
            if spec.base and "pip" in cmd:
                # The base's packages come after this env's own on sys.path: pip installs only what differs (it never
                # removes files outside this env), so the base's CUDA torch is not installed twice on a full disk.
                site = site_packages(venv, spec.python)
                (site / "zephon-compat-base.pth").write_text(f"{site_packages(root / spec.base, spec.python)}\n")
            log(f"[{spec.name}] {' '.join(cmd)}")
            fh.write(f"$ {' '.join(cmd)}\n")
            fh.flush()
            try:
                rc = subprocess.run(cmd, cwd=REPO, stdout=fh, stderr=subprocess.STDOUT, timeout=3600).returncode
            except subprocess.TimeoutExpired:
                raise EnvError(f"install timed out after 3600 s (log: {logfile})") from None
            if rc != 0:
                fh.flush()
                raise EnvError(f"{'pip install' if 'pip' in cmd else 'venv'} exited {rc}: {_tail(logfile)} "
                               f"(log: {logfile})")
    stamp_file.write_text(want)
    log(f"[{spec.name}] installed in {time.monotonic() - t0:.0f} s")
    return venv / "bin" / "python"


def versions(python: Path) -> dict[str, str]:
    """Python version and installed versions of ``REPORTED`` packages ("" when absent) in that env."""
    code = ("import importlib.metadata as m, json, platform, sys\n"
            "v = {'python': platform.python_version()}\n"
            f"for p in {REPORTED!r}:\n"
            "    try: v[p] = m.version(p)\n"
            "    except m.PackageNotFoundError: v[p] = ''\n"
            "print(json.dumps(v))")
    out = subprocess.run([str(python), "-c", code], capture_output=True, text=True, timeout=120)
    if out.returncode != 0:
        raise EnvError(f"cannot read versions: {out.stderr.strip()[-300:]}")
    return json.loads(out.stdout)


def run_tests(spec: EnvSpec, python: Path, root: Path, *, log=print, pytest_args=()) -> dict:
    """Run the contract tests of ``spec.hosts`` with ``python -m pytest`` and the recording plugin.
    Returns the plugin's report (``exitstatus``, ``tests``, ``collect_errors``) plus ``log``.
    Raises EnvError when pytest wrote no report (crash, timeout)."""
    report = root / f"{spec.name}.report.json"
    logfile = root / f"{spec.name}.pytest.log"
    report.unlink(missing_ok=True)
    # --continue-on-collection-errors: a module that fails at import fails its own rows, not the column.
    cmd = [str(python), "-m", "pytest", "-p", "compat_matrix.pytest_plugin", "-p", "no:cacheprovider",
           "--continue-on-collection-errors",
           "--contract-hosts", ",".join(spec.hosts), "--compat-report", str(report), "-q", *pytest_args]
    # This checkout's zephon and adapters first: an environment's editable install may point at the checkout
    # that built it (another clone or worktree), and the matrix must test the code it runs from.
    env = dict(os.environ, TQDM_DISABLE="1", PYTHONPATH=os.pathsep.join([str(REPO), str(REPO / "adapters")]))
    log(f"[{spec.name}] {' '.join(cmd[1:])}")
    with open(logfile, "w") as fh:
        try:
            rc = subprocess.run(cmd, cwd=REPO, env=env, stdout=fh, stderr=subprocess.STDOUT, timeout=3600).returncode
        except subprocess.TimeoutExpired:
            raise EnvError(f"pytest timed out after 3600 s (log: {logfile})") from None
    if not report.exists():
        raise EnvError(f"pytest exited {rc} without a report: {_tail(logfile)} (log: {logfile})")
    data = json.loads(report.read_text())
    data["log"] = str(logfile)
    return data


def source_revision() -> str:
    """The commit the tests ran from, with "+changes" when the work tree differed from it; "" outside git."""
    try:
        head = subprocess.run(["git", "rev-parse", "--short=12", "HEAD"], cwd=REPO, capture_output=True,
                              text=True, timeout=30)
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no", "--", ".",
                                ":!compat_matrix/MATRIX.md", ":!compat_matrix/MATRIX.json"],  # the run's own output
                               cwd=REPO, capture_output=True, text=True, timeout=30)
    except OSError:
        return ""
    if head.returncode != 0:
        return ""
    return head.stdout.strip() + ("+changes" if dirty.stdout.strip() else "")
