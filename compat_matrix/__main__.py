"""``python -m compat_matrix run [--env NAME ...] [--fresh] [--venv-root DIR]``: build the environments of
manifest.toml, run the contract tests in each, write compat_matrix/MATRIX.md and MATRIX.json.
``python -m compat_matrix render`` rewrites MATRIX.md from MATRIX.json; ``list`` prints the manifest.

Without ``--env`` every environment runs and the matrix is written from scratch; with ``--env`` only
those columns are re-run and the others are kept from MATRIX.json (each column carries its own date).
Exit status 1 when any cell fails.
"""
from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import sys
import time
from pathlib import Path

from . import envs as E
from . import matrix

HERE = Path(__file__).resolve().parent
MD, JS = HERE / "MATRIX.md", HERE / "MATRIX.json"


def _machine() -> str:
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as fh:
            cpu = next(line.split(":", 1)[1].strip() for line in fh if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    return f"{platform.system()} {platform.machine()}, {os.cpu_count()} cores ({cpu}), no GPU" \
        if not os.path.exists("/dev/nvidia0") else f"{platform.system()} {platform.machine()} with a GPU"


def run_env(spec: E.EnvSpec, root: Path, fresh: bool, pytest_args) -> dict:
    res = {"name": spec.name, "why": spec.why, "hosts": list(spec.hosts), "install": list(spec.install),
           "date": dt.date.today().isoformat(), "python_path": "", "versions": {}, "status": "ok", "error": "",
           "exitstatus": None, "seconds": {}, "tests": [], "collect_errors": [], "revision": E.source_revision()}
    t0 = time.monotonic()
    try:
        py = E.build(spec, root, fresh=fresh)
        res["python_path"] = str(py)
        res["versions"] = E.versions(py)
    except E.EnvError as e:
        res.update(status="install failed", error=str(e))
        return res
    finally:
        res["seconds"]["install"] = round(time.monotonic() - t0, 1)
    t0 = time.monotonic()
    try:
        rep = E.run_tests(spec, py, root, pytest_args=pytest_args)
        res.update(exitstatus=rep["exitstatus"], tests=rep["tests"], collect_errors=rep["collect_errors"])
    except E.EnvError as e:
        res.update(status="tests crashed", error=str(e))
    res["seconds"]["tests"] = round(time.monotonic() - t0, 1)
    return res


def write(envs: list[dict]) -> dict:
    m = matrix.build(envs, dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"), _machine())
    JS.write_text(matrix.dump_json(m))
    MD.write_text(matrix.render_md(m))
    return m


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m compat_matrix", description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run", help="build environments, run contract tests, write MATRIX.md/.json")
    r.add_argument("--env", action="append", default=[], help="only this environment (repeatable)")
    r.add_argument("--fresh", action="store_true", help="rebuild environments even if their stamp matches")
    r.add_argument("--venv-root", default=os.path.expanduser("~/.cache/zephon/compat-envs"),
                   help="where environments, logs and reports go (default: %(default)s)")
    r.add_argument("pytest_args", nargs="*", help="extra pytest arguments, after --")
    sub.add_parser("render", help="rewrite MATRIX.md from MATRIX.json")
    sub.add_parser("list", help="print the environments of manifest.toml")
    a = ap.parse_args(argv)
    try:
        specs = E.load_manifest()
    except (ValueError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if a.cmd == "list":
        for s in specs:
            print(f"{s.name:18} python {s.python}  hosts {','.join(s.hosts)}\n{'':18} {' '.join(s.install)}\n"
                  f"{'':18} {s.why}")
        return 0
    if a.cmd == "render":
        try:
            m = json.loads(JS.read_text())
            md = matrix.render_md(m)
        except FileNotFoundError:
            print(f"error: {JS} does not exist: `python -m compat_matrix run` creates it", file=sys.stderr)
            return 2
        except (ValueError, KeyError, TypeError) as e:
            print(f"error: {JS} is not a matrix this version writes ({type(e).__name__}: {e}); re-run "
                  f"`python -m compat_matrix run`", file=sys.stderr)
            return 2
        MD.write_text(md)
        print(f"wrote {MD}")
        return 0
    names = [s.name for s in specs]
    unknown = [n for n in a.env if n not in names]
    if unknown:
        ap.error(f"unknown --env {unknown}; manifest has {names}")
    old = {e["name"]: e for e in json.loads(JS.read_text())["envs"]} if a.env and JS.exists() else {}
    missing = [n for n in names if n not in a.env and n not in old]
    if a.env and missing:
        print(f"note: no earlier results for {missing}: the matrix will lack those columns until they run")
    results = {}
    for s in specs:
        if a.env and s.name not in a.env:
            if s.name in old:
                results[s.name] = old[s.name]
            continue
        print(f"== {s.name}: {s.why}", flush=True)
        res = run_env(s, Path(a.venv_root), a.fresh, a.pytest_args)
        results[s.name] = res
        c = {o: sum(t["outcome"] == o for t in res["tests"]) for o in ("passed", "failed", "skipped")}
        print(f"== {s.name}: {res['status']} {res['error']} passed {c['passed']} failed {c['failed']} "
              f"skipped {c['skipped']} ({res['seconds']})", flush=True)
        m = write([results[n] for n in names if n in results])  # after each column: survives an interruption
    fails = [(r["id"], n) for r in m["rows"] for n, c in r["cells"].items() if c["status"] == "fail"]
    print(f"wrote {MD} and {JS.name}: {len(m['rows'])} rows x {len(m['envs'])} environments, "
          f"{len(fails)} failing cells")
    for rid, n in fails:
        print(f"  FAIL {rid} in {n}")
    return 1 if fails else 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt:  # MATRIX.* keep the columns finished before the interruption
        print("\ninterrupted: MATRIX.md / MATRIX.json hold the columns finished so far", file=sys.stderr)
        sys.exit(130)
