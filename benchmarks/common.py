"""Shared plumbing of the side-by-side suite: child processes, peak RSS, CPU time, medians, machine info.

Every measurement runs in its own subprocess (``python -m benchmarks.child KIND JSON``) so that peak
RSS belongs to one configuration and no peer's threads, forks or shared memory leak into another's.
The child prints one line ``RESULT_TAG {json}``; the parent collects it. Nothing here asserts speed.
"""
from __future__ import annotations

import datetime
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
RESULT_TAG = "@@zephon-bench "


def tests_module(name: str):
    """The test-data builder module tests/<name>.py (data builders live with the tests; benchmarks reuse them).

    name: the module's file name without ``.py``, e.g. ``vl_data``. Loaded by path, so neither tests/ on
    ``sys.path`` nor a package named ``tests`` elsewhere on it matters. Raises FileNotFoundError naming the path.
    """
    import importlib.util

    key = f"_zephon_tests_{name}"
    if key not in sys.modules:
        path = REPO / "tests" / f"{name}.py"
        if not path.is_file():
            raise FileNotFoundError(f"{path}: the benchmarks read their test data builders from the checkout's tests/")
        spec = importlib.util.spec_from_file_location(key, path)
        mod = importlib.util.module_from_spec(spec)
        sys.modules[key] = mod
        spec.loader.exec_module(mod)
    return sys.modules[key]


# ------------------------------------------------------------------------------ inside a child

def peak_rss_mib(pid="self") -> float | None:
    """VmHWM (peak RSS) of a live process in MiB (not ru_maxrss: that survives execve)."""
    try:
        with open(f"/proc/{pid}/status") as fh:
            for line in fh:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    if pid == "self":
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return None


def children_pids() -> list[int]:
    """Every live descendant of this process (DataLoader workers, Grain/Streaming processes, runners)."""
    try:
        import psutil

        return [p.pid for p in psutil.Process().children(recursive=True)]
    except Exception:  # psutil missing or a race with an exiting child
        import multiprocessing

        return [p.pid for p in multiprocessing.active_children() if p.pid]


class PeriodicWatch:
    """A daemon thread calling ``tick()`` every ``interval`` seconds while the ``with`` block runs (memory peaks
    of processes that may exit before the end, which a final reading would miss). Subclasses define ``tick``."""

    def __init__(self, interval: float):
        import threading

        self.interval = interval
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._run, daemon=True)

    def tick(self) -> None:
        raise NotImplementedError

    def _run(self):
        while not self._stop.is_set():
            self.tick()
            self._stop.wait(self.interval)

    def __enter__(self):
        self._t.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._t.join()


class RssWatch(PeriodicWatch):
    """Peak RSS of this process and of the largest / summed descendants, sampled every 50 ms on a thread
    (descendants may exit before the end of the pass, so VmHWM alone would miss them)."""

    def __init__(self, interval: float = 0.05):
        super().__init__(interval)
        self.peak_children = {}

    def tick(self) -> None:
        for pid in children_pids():
            r = peak_rss_mib(pid)
            if r is not None:
                self.peak_children[pid] = max(r, self.peak_children.get(pid, 0.0))

    def result(self) -> dict:
        ch = list(self.peak_children.values())
        main = peak_rss_mib()
        return {"rss_main_mib": main, "rss_worker_mib": max(ch) if ch else None,
                "rss_total_mib": main + sum(ch)}


def cpu_seconds() -> float:
    """User + system CPU seconds of this process and all its live descendants."""
    ru = resource.getrusage(resource.RUSAGE_SELF)
    total = ru.ru_utime + ru.ru_stime
    ruc = resource.getrusage(resource.RUSAGE_CHILDREN)  # reaped children
    total += ruc.ru_utime + ruc.ru_stime
    tick = os.sysconf("SC_CLK_TCK")
    for pid in children_pids():
        try:
            with open(f"/proc/{pid}/stat") as fh:
                f = fh.read().rsplit(")", 1)[1].split()
            total += (int(f[11]) + int(f[12])) / tick
        except (OSError, IndexError, ValueError):
            pass
    return total


def emit(result: dict) -> None:
    print(RESULT_TAG + json.dumps(result), flush=True)


class Timer:
    def __enter__(self):
        self.c0, self.t0 = cpu_seconds(), time.perf_counter()
        return self

    def __exit__(self, *exc):
        self.seconds = time.perf_counter() - self.t0
        self.cpu = cpu_seconds() - self.c0


# ------------------------------------------------------------------------------ in the parent

def run_child(kind: str, cfg: dict, *, timeout: float = 600, env_extra: dict | None = None,
              log=None) -> dict | None:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH")) if p)
    env.setdefault("PYTHONWARNINGS", "ignore")
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    if env_extra:
        env.update(env_extra)
    argv = [sys.executable, "-m", "benchmarks.child", kind, json.dumps(cfg)]
    try:
        proc = subprocess.run(argv, cwd=str(REPO), env=env, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as e:
        _log(log, f"[{kind} {cfg.get('name', '')}] timed out after {timeout:.0f} s")
        return {"error": f"timeout {timeout:.0f}s", "stderr": str(e.stderr)[-2000:] if e.stderr else ""}
    for line in proc.stdout.splitlines():
        if line.startswith(RESULT_TAG):
            return json.loads(line[len(RESULT_TAG):])
    _log(log, f"[{kind} {cfg.get('name', '')}] failed (exit {proc.returncode}):\n{proc.stderr[-3000:]}")
    return {"error": f"exit {proc.returncode}", "stderr": proc.stderr[-3000:]}


def _log(log, msg):
    (log or sys.stderr.write)(msg + "\n")


def ok(results) -> list[dict]:
    return [r for r in results if r and "error" not in r]


def median(xs):
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def mem_total_gib() -> float | None:
    try:
        with open("/proc/meminfo") as fh:
            for line in fh:
                if line.startswith("MemTotal:"):
                    return int(line.split()[1]) / 2**20
    except OSError:
        pass
    return None


def code_version() -> str:
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=str(REPO), capture_output=True,
                              text=True, timeout=10).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--", "zephon", "adapters"], cwd=str(REPO),
                               capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return (head or "unknown") + (" + uncommitted changes in zephon/ or adapters/" if dirty else "")


def versions() -> dict:
    from importlib import metadata

    out = {"python": platform.python_version()}
    for dist in ("zephon-loader", "grain", "mosaicml-streaming", "megatron-energon", "torch", "torchdata",
                 "webdataset", "tokenizers", "numpy", "pyarrow"):
        try:
            out[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            out[dist] = None
    return out


def core_digest() -> str:
    """SHA-256 (16 hex digits) of the core and adapter sources (zephon/, adapters/) as they are on disk now:
    another engineer may change them while a long run goes on, and each process imports what it finds."""
    import hashlib

    h = hashlib.sha256()
    for p in sorted(list((REPO / "zephon").rglob("*.py")) + list((REPO / "adapters").rglob("*.py"))):
        h.update(str(p.relative_to(REPO)).encode() + b"\0" + p.read_bytes())
    return h.hexdigest()[:16]


def machine() -> dict:
    return {"date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%MZ"),
            "nproc": os.cpu_count(), "affinity": len(os.sched_getaffinity(0)), "cpu": cpu_model(),
            "mem_gib": mem_total_gib(), "os": platform.platform(), "code": code_version(),
            "load_before": os.getloadavg()[0], "versions": versions()}


def save_panels(path: str, panels, figsize=(10, 3.6)) -> None:
    """Save side-by-side line plots to ``path`` (matplotlib, Agg).

    panels: ``[(title, xlabel, (xscale, yscale), [(xs, ys, plot keywords), ...]), ...]``, one per panel;
    scales are matplotlib's (``"linear"``, ``"log"``, ``("log", 2)`` for base 2)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(panels), figsize=figsize)
    for ax, (title, xlabel, (xscale, yscale), series) in zip(axes, panels):
        for xs, ys, kw in series:
            ax.plot(xs, ys, **kw)
        if isinstance(xscale, tuple):
            ax.set_xscale(xscale[0], **xscale[1])
        else:
            ax.set_xscale(xscale)
        if yscale == "linear":
            ax.set_ylim(bottom=0)
        else:
            ax.set_yscale(yscale)
        ax.set_xlabel(xlabel)
        ax.set_title(title)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def markdown_table(columns, rows) -> str:
    """A Markdown table. columns: header names, a trailing ``"<"`` left-aligns that column (else right-aligned);
    rows: lists of cells (str)."""
    names = [c.rstrip("<") for c in columns]
    align = ["---" if c.endswith("<") else "---:" for c in columns]
    lines = ["| " + " | ".join(names) + " |", "|" + "|".join(align) + "|"]
    return "\n".join(lines + ["| " + " | ".join(r) + " |" for r in rows])
