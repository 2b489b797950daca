"""Free-threaded Python: inline, threads and processes runners on the vision-language pipeline, on 3.13t and 3.11.

    python -m benchmarks --only freethreaded [--quick]

The parent (the default 3.11 venv) writes the data once (tests/vl_data.py: an MDS ``jpeg`` dataset and an
Energon ``CaptioningSample`` dataset of the same natural-looking JPEGs), then runs each configuration in its own
child process, ``python -m benchmarks.child freethreaded.run JSON``, on each interpreter: the free-threaded one
(``find_freethreaded_python``; built by scripts/freethreaded.sh) and this one. A child reports samples/s after
its first global batch, the time to that batch, peak PSS summed over itself and its descendants (psutil,
sampled every 0.5 s) and whether the GIL was on. ``python -m benchmarks.child freethreaded.check JSON`` (on any
interpreter) prints per-runner global-batch digests for tests/test_freethreaded.py. Prints a table, writes it
and a plot into docs/benchmarks.md (between the ``freethreaded`` markers) and docs/img/ unless ``quick``.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

from benchmarks.common import RESULT_TAG, PeriodicWatch, tests_module

REPO = Path(__file__).resolve().parent.parent
START, END = "<!-- freethreaded:start -->", "<!-- freethreaded:end -->"
RUNNERS = ("inline", "threads", "processes")
WORKERS = 2


def find_freethreaded_python() -> str | None:
    """The free-threaded interpreter to use: ``$ZEPHON_FT_PYTHON``, else the venv scripts/freethreaded.sh makes
    (``$ZEPHON_FT_HOME/venv``, default ``~/.cache/zephon-ft/venv``); None when neither exists."""
    env = os.environ.get("ZEPHON_FT_PYTHON")
    if env:
        return env if os.access(env, os.X_OK) else None
    home = os.environ.get("ZEPHON_FT_HOME", os.path.expanduser("~/.cache/zephon-ft"))
    p = os.path.join(home, "venv", "bin", "python")
    return p if os.access(p, os.X_OK) else None


# ------------------------------------------------------------------------------ inside a child

def _gil_enabled() -> bool:
    f = getattr(sys, "_is_gil_enabled", None)
    return True if f is None else bool(f())


class PssWatch(PeriodicWatch):
    """Peak of (PSS of this process + PSS of every live descendant), in MiB, sampled every ``interval`` s.
    Reading PSS walks the page tables under each process's memory lock: sampled too often, it slows the run."""

    def __init__(self, interval: float = 0.5):
        import psutil

        super().__init__(interval)
        self.psutil, self.peak = psutil, 0.0

    def sample(self) -> float:
        me = self.psutil.Process()
        total = 0
        for p in [me] + me.children(recursive=True):
            try:
                total += p.memory_full_info().pss
            except (self.psutil.NoSuchProcess, self.psutil.AccessDenied, self.psutil.ZombieProcess):
                pass
        return total / 2**20

    def cpu_seconds(self) -> float:
        """User + system CPU seconds of this process, its reaped children and its live descendants."""
        me = self.psutil.Process()
        t = me.cpu_times()
        total = t.user + t.system + t.children_user + t.children_system
        for p in me.children(recursive=True):
            try:
                c = p.cpu_times()
                total += c.user + c.system
            except (self.psutil.NoSuchProcess, self.psutil.AccessDenied, self.psutil.ZombieProcess):
                pass
        return total

    def tick(self) -> None:
        self.peak = max(self.peak, self.sample())


def child_run(cfg: dict) -> dict:
    """One measurement: ``cfg`` = kind, root, runner, workers, steps, seed. Returns the result dict."""
    vl_loader = tests_module("vl_data").vl_loader

    import zephon.ops.vision  # noqa: F401  (the pipeline's modules, imported before the GIL check)

    L = vl_loader(cfg["kind"], cfg["root"], runner=cfg["runner"], num_workers=cfg["workers"],
                  canonical_replicas=8, micro_batch=8, chunk_size=64, unit_size=16, seed=cfg.get("seed", 0))
    per_step = len(L.lanes) * (L.rows_per_lane_step // L.batch.micro_batch_size)
    rows = 0
    with PssWatch(cfg.get("pss_interval", 0.5)) as watch:
        t0 = time.perf_counter()
        it = iter(L)
        for _ in range(per_step):
            rows += len(next(it)["pixel_values"])
        t1, c1 = time.perf_counter(), watch.cpu_seconds()
        for _ in range(cfg["steps"] * per_step):
            rows += len(next(it)["pixel_values"])
        t2, c2 = time.perf_counter(), watch.cpu_seconds()
        it.close()
        L.close()
    steady = rows - L.global_batch_size
    return {"python": sys.version.split()[0], "abi": sys.abiflags, "gil": _gil_enabled(), "rows": rows,
            "first_batch_s": t1 - t0, "seconds": t2 - t1, "rate": steady / (t2 - t1), "pss_mib": watch.peak,
            "cpu_ms_per_sample": 1e3 * (c2 - c1) / steady,
            **{k: cfg[k] for k in ("kind", "runner", "workers")}}


def child_check(cfg: dict) -> dict:
    """Global-batch digests (``zephon.engine.GlobalBatchHasher``) of ``cfg["steps"]`` steps per runner, the rows'
    sample pointers and caption ids of the inline run, and the GIL state after every import and run."""
    vl_loader = tests_module("vl_data").vl_loader
    from zephon.engine import GlobalBatchHasher

    out = {"python": sys.version, "gil_after_import": None, "digests": {}, "rows": []}
    import zephon.ops.vision  # noqa: F401

    out["gil_after_import"] = _gil_enabled()
    for runner in cfg.get("runners", RUNNERS):
        L = vl_loader(cfg["kind"], cfg["root"], runner=runner, num_workers=cfg.get("workers", 2))
        h = GlobalBatchHasher()
        it = iter(L)
        for _ in range(cfg["steps"] * len(L.lanes) * (L.rows_per_lane_step // L.batch.micro_batch_size)):
            mb = next(it)
            h.add(mb)
            if runner == "inline":
                out["rows"] += [[list(s[:3]), ids.tolist()] for s, ids in zip(mb["__src__"], mb["input_ids"])]
        it.close()
        L.close()
        out["digests"][runner] = h.digests()
    out["gil_after_run"] = _gil_enabled()
    return out


# ------------------------------------------------------------------------------ in the parent

def prepare(workdir: str, n: int) -> dict:
    """The two datasets of ``n`` samples under ``workdir/vl-N`` (written once; a marker file says it is done)."""
    vl = tests_module("vl_data")
    natural_jpeg, write_energon, write_mds = vl.natural_jpeg, vl.write_energon, vl.write_mds

    base = Path(workdir) / f"vl-{n}"
    done = base / "done.json"
    if not done.exists():
        import shutil

        shutil.rmtree(base, ignore_errors=True)
        base.mkdir(parents=True)
        samples = {i: natural_jpeg(i) for i in range(n)}
        write_mds(str(base / "mds"), n, samples=samples)
        write_energon(str(base / "energon"), n, samples=samples)
        sizes = [len(b) for b, _ in samples.values()]
        done.write_text(json.dumps({"n": n, "jpeg_bytes_mean": sum(sizes) / n}))
    return {"mds": str(base / "mds"), "energon": str(base / "energon"), **json.loads(done.read_text())}


def _spin(seconds: float, q) -> None:
    n, end = 0, time.perf_counter() + seconds
    while time.perf_counter() < end:
        n += 1
    q.put(n)


def parallel_capacity(seconds: float = 1.0) -> float:
    """How many cores this machine gives us now: pure-Python loop iterations of 2 processes at once over those
    of 1 process alone (2.0 on an idle 2-core machine; near 1.0 when other jobs hold the second core)."""
    import multiprocessing as mp

    ctx = mp.get_context("fork")
    counts = []
    for k in (1, 2):
        q = ctx.Queue()
        ps = [ctx.Process(target=_spin, args=(seconds, q)) for _ in range(k)]
        for p in ps:
            p.start()
        counts.append(sum(q.get() for _ in ps))
        for p in ps:
            p.join()
    return counts[1] / counts[0]


def run_child(python: str, mode: str, cfg: dict, timeout: float = 900) -> dict:
    """Run ``python -m benchmarks.child freethreaded.MODE JSON`` (MODE: run or check) with the checkout on the
    path; its result dict, or ``{"error": ...}`` naming the interpreter and the tail of its stderr."""
    env = dict(os.environ, PYTHONPATH=str(REPO), PYTHONWARNINGS="ignore")
    try:
        p = subprocess.run([python, "-m", "benchmarks.child", f"freethreaded.{mode}", json.dumps(cfg)],
                           cwd=str(REPO), env=env, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"error": f"{python}: timed out after {timeout:.0f} s"}
    for line in p.stdout.splitlines():
        if line.startswith(RESULT_TAG):
            return json.loads(line[len(RESULT_TAG):])
    return {"error": f"{python} exited {p.returncode}: {p.stderr[-3000:]}"}


def main(workdir: str, quick: bool) -> str:
    """Run every (interpreter, dataset, runner) once, interleaved; print the table; write doc + plot unless quick."""
    ft = find_freethreaded_python()
    if ft is None:
        print("# no free-threaded interpreter found: build one with `bash scripts/freethreaded.sh` (or set "
              "ZEPHON_FT_PYTHON); measuring 3.11 only", flush=True)
    n = 128 if quick else 384
    data = prepare(workdir, n)
    steps = 4 if quick else 12
    pythons = ([("3.13t", ft)] if ft else []) + [("3.11", sys.executable)]
    kinds = ("mds",) if quick else ("mds", "energon")
    results = []
    load0, cap0 = os.getloadavg()[0], parallel_capacity()
    print(f"# parallel capacity before: {cap0:.2f} cores (2 processes' work over 1's)", flush=True)
    for kind in kinds:
        for label, py in pythons:
            for runner in RUNNERS:
                cfg = {"kind": kind, "root": data[kind], "runner": runner, "workers": WORKERS, "steps": steps}
                r = run_child(py, "run", cfg)
                r.update(interp=label, kind=kind, runner=runner)
                results.append(r)
                msg = r["error"][-600:] if "error" in r else (
                    f"{r['rate']:8.1f} samples/s  first batch {r['first_batch_s']:5.2f} s  peak PSS "
                    f"{r['pss_mib']:7.1f} MiB  CPU {r['cpu_ms_per_sample']:5.1f} ms/sample  "
                    f"GIL {'on' if r['gil'] else 'off'}")
                print(f"  {label:<6} {kind:<8} {runner:<10} {msg}", flush=True)
    cap1 = parallel_capacity()
    table = render(results, data, steps, quick, load0, os.getloadavg()[0], (cap0, cap1))
    print(table)
    if not quick:
        plot(results, REPO / "docs" / "img" / "bench-freethreaded.png")
        write_doc(table)
    return table


def _rate(results, interp, kind, runner):
    for r in results:
        if (r.get("interp"), r.get("kind"), r.get("runner")) == (interp, kind, runner) and "error" not in r:
            return r
    return None


def render(results: list, data: dict, steps: int, quick: bool, load0: float, load1: float,
           capacity: tuple = (None, None)) -> str:
    """The markdown table and the headline ratios."""
    lines = [f"{data['n']} JPEGs (300-640 px a side, {data['jpeg_bytes_mean'] / 1024:.0f} KiB on average) -> "
             f"decode, crop seeded by the sample pointer, resize to 224x224, normalise to float32 CHW, byte-level "
             f"caption tokens (64); 8 lanes, global batch 64, `unit_size=16`; {steps} global batches after the "
             f"first; {WORKERS} workers for threads and processes; one run each on 2 cores shared with other jobs "
             f"(load average {load0:.1f} before, {load1:.1f} after; 2 processes did "
             f"{capacity[0] or 0:.2f}x / {capacity[1] or 0:.2f}x the work of 1 before / after: the cores we had): "
             f"expect large run-to-run variation. "
             f"`python -m benchmarks --only freethreaded{' --quick' if quick else ''}`.", "",
             "| dataset | python | runner | samples/s | CPU ms / sample | first batch (s) | peak PSS (MiB) | GIL |",
             "|---|---|---|---:|---:|---:|---:|---|"]
    for r in results:
        if "error" in r:
            lines.append(f"| {r['kind']} | {r['interp']} | {r['runner']} | error | | | | |")
            continue
        lines.append(f"| {r['kind']} | {r['interp']} | {r['runner']} | {r['rate']:,.1f} | "
                     f"{r['cpu_ms_per_sample']:.1f} | {r['first_batch_s']:.2f} | "
                     f"{r['pss_mib']:,.0f} | {'on' if r['gil'] else 'off'} |")
    lines.append("")
    for kind in sorted({r["kind"] for r in results}):
        t_ft, p_ft = _rate(results, "3.13t", kind, "threads"), _rate(results, "3.13t", kind, "processes")
        t_311, p_311 = _rate(results, "3.11", kind, "threads"), _rate(results, "3.11", kind, "processes")
        i_ft = _rate(results, "3.13t", kind, "inline")
        parts = []
        if t_ft and p_ft:
            parts.append(f"threads on 3.13t / processes on 3.13t = **{t_ft['rate'] / p_ft['rate']:.2f}x**")
        if t_ft and p_311:
            parts.append(f"threads on 3.13t / processes on 3.11 = {t_ft['rate'] / p_311['rate']:.2f}x")
        if t_311 and p_311:
            parts.append(f"threads on 3.11 / processes on 3.11 = {t_311['rate'] / p_311['rate']:.2f}x")
        if t_ft and i_ft:
            parts.append(f"threads on 3.13t / inline on 3.13t = {t_ft['rate'] / i_ft['rate']:.2f}x")
        if parts:
            lines.append(f"- {kind}: " + "; ".join(parts) + ".")
    return "\n".join(lines)


def plot(results: list, path: Path) -> None:
    """Grouped bars: samples/s and peak PSS per (dataset, python), one bar per runner."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    groups = [(k, i) for k in ("mds", "energon") for i in ("3.13t", "3.11")
              if any(_rate(results, i, k, r) for r in RUNNERS)]
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    width = 0.8 / len(RUNNERS)
    for ax, key, title in ((axes[0], "rate", "samples/s (higher is better)"),
                           (axes[1], "pss_mib", "peak PSS, MiB (lower is better)")):
        for j, runner in enumerate(RUNNERS):
            vals = [(_rate(results, i, k, runner) or {}).get(key, 0) for k, i in groups]
            ax.bar([g + j * width for g in range(len(groups))], vals, width, label=runner)
        ax.set_xticks([g + width for g in range(len(groups))])
        ax.set_xticklabels([f"{k}\n{i}" for k, i in groups])
        ax.set_title(title)
    axes[0].legend()
    fig.suptitle(f"Vision-language pipeline, {WORKERS} workers, 2 cores: free-threaded 3.13t vs 3.11")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)


def write_doc(table: str) -> None:
    """Replace (or append) the ``freethreaded`` section of docs/benchmarks.md with ``table``, keeping the notes
    written between the table markers and the section end."""
    doc = REPO / "docs" / "benchmarks.md"
    text = doc.read_text(encoding="utf-8")
    t0, t1 = "<!-- freethreaded-table:start -->", "<!-- freethreaded-table:end -->"
    if t0 in text and t1 in text:
        text = text[:text.index(t0) + len(t0)] + "\n" + table + "\n" + text[text.index(t1):]
    else:
        text = (text.rstrip("\n") + f"\n\n{START}\n## Free-threaded Python: `python -m benchmarks --only freethreaded`"
                f"\n\n{t0}\n{table}\n{t1}\n\n![free-threaded](img/bench-freethreaded.png)\n{END}\n")
    doc.write_text(text, encoding="utf-8")

