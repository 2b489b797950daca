"""Cells of the compatibility matrix from per-environment results, rendered as MATRIX.md and MATRIX.json.

An environment result (one column) is plain JSON::

    {"name", "why", "hosts", "install", "date", "python_path", "versions": {pkg: version},
     "status": "ok" | "install failed" | "tests crashed", "error": str, "exitstatus": int,
     "seconds": {"install": s, "tests": s}, "tests": [{"id", "contracts", "outcome", "reason", "seconds"}],
     "collect_errors": [{"id", "reason"}]}

A cell (row x column) is ``{"status": "pass" | "fail" | "skip" | "n/a", "reason": one line, "tests": [ids]}``.
"""
from __future__ import annotations

import json
from collections import Counter

from .contracts import CONTRACTS, HOSTS

SHOWN_VERSIONS = [("python", "Python"), ("torch", "torch"), ("torchvision", "torchvision"),
                  ("torchdata", "torchdata"), ("mosaicml", "Composer (mosaicml)"),
                  ("mosaicml-streaming", "mosaicml-streaming"), ("megatron-energon", "megatron-energon"),
                  ("webdataset", "webdataset"), ("torchtitan", "torchtitan"), ("numpy", "numpy")]


def cell(contract, env: dict) -> dict:
    """The cell of ``contract`` in environment result ``env``: fail if any of its tests failed (or none
    could be collected), pass if at least one passed and none failed, skip if all were skipped, n/a when
    the environment does not carry the contract's host."""
    if contract.host not in env["hosts"]:
        return {"status": "n/a", "reason": "host not installed in this environment", "tests": []}
    if env["status"] != "ok":
        return {"status": "fail", "reason": f"{env['status']}: {env['error']}", "tests": []}
    tests = [t for t in env["tests"] if contract.id in t["contracts"]]
    ids = [t["id"] for t in tests]
    by = Counter(t["outcome"] for t in tests)
    if not tests:
        why = (f"collection error: {env['collect_errors'][0]['id']}: {env['collect_errors'][0]['reason']}"
               if env["collect_errors"] else "no test collected for this row")
        return {"status": "fail", "reason": why, "tests": ids}
    bad = [t for t in tests if t["outcome"] not in ("passed", "skipped")]
    if bad:
        return {"status": "fail", "tests": ids,
                "reason": f"{len(bad)}/{len(tests)} failed; {bad[0]['id']}: {bad[0]['reason'] or bad[0]['outcome']}"}
    skipped = [t for t in tests if t["outcome"] == "skipped"]
    if by["passed"]:
        reason = f"{len(skipped)} of {len(tests)} skipped: {skipped[0]['reason']}" if skipped else ""
        return {"status": "pass", "reason": reason, "tests": ids}
    return {"status": "skip", "reason": skipped[0]["reason"], "tests": ids}


def build(envs: list[dict], generated: str, machine: str) -> dict:
    """MATRIX.json's content: environments (columns, in manifest order) and one entry per contract row."""
    rows = [{"id": c.id, "host": c.host, "title": c.title, "cells": {e["name"]: cell(c, e) for e in envs}}
            for c in CONTRACTS]
    return {"generated": generated, "machine": machine, "command": "python -m compat_matrix run",
            "hosts": HOSTS, "envs": envs, "rows": rows}


_MARK = {"pass": "pass", "fail": "**FAIL**", "skip": "skip", "n/a": "—"}
_OUT = {"passed": "pass", "failed": "**FAIL**", "skipped": "skip", "not run": "not run"}


def _esc(s: str) -> str:
    return s.replace("|", "\\|").replace("\n", " ")


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    out = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    out += ["| " + " | ".join(_esc(c) for c in r) + " |" for r in rows]
    return out


def render_md(m: dict) -> str:
    envs = m["envs"]
    names = [e["name"] for e in envs]
    L = ["# Zephon compatibility matrix", "",
         f"Generated {m['generated']} by `{m['command']}` on {m['machine']}; do not edit by hand "
         "(`python -m compat_matrix render` rewrites it from MATRIX.json). Each column is one virtual "
         "environment of `compat_matrix/manifest.toml`; each row is a host-contract item of "
         "`compat_matrix/contracts.py`, proven by the tests listed under Evidence.", "",
         "Cells: **pass** (at least one test of the row passed and none failed; skipped ones are named), "
         "**FAIL** (a test failed or was a known failure, or none could run; reason given), **skip** (every "
         "test was skipped; reason given), **—** (the environment does not run that host's tests: see its "
         "`hosts` in manifest.toml).", ""]
    L += ["## Environments", ""]
    vrows = [[label] + [e.get("versions", {}).get(key) or "—" for e in envs] for key, label in SHOWN_VERSIONS]
    count = [["tests passed / failed / skipped"] + [
        "{}/{}/{}".format(*(sum(t["outcome"] == o for t in e["tests"]) for o in ("passed", "failed", "skipped")))
        for e in envs]]
    def status(e):
        if e["status"] != "ok":
            return f"**{e['status']}**: {e['error']}"
        errs = e.get("collect_errors") or []
        if not errs:
            return "ok"
        return f"ok; **{len(errs)} modules failed to import**: {errs[0]['id']}: {errs[0]['reason']}"

    meta = [["run on"] + [e["date"] for e in envs],
            ["source revision"] + [e.get("revision") or "—" for e in envs],
            ["status"] + [status(e) for e in envs],
            ["install / tests (s)"] + [f"{e['seconds'].get('install', 0):.0f} / {e['seconds'].get('tests', 0):.0f}"
                                       for e in envs],
            ["what it proves"] + [e["why"] for e in envs]]
    L += _table(["", *names], meta + vrows + count) + [""]
    L += ["## Supported at a glance", ""]
    glance = []
    for host, title in m["hosts"].items():
        rows = [r for r in m["rows"] if r["host"] == host]
        cells = []
        for n in names:
            st = Counter(r["cells"][n]["status"] for r in rows)
            if st["n/a"] == len(rows):
                cells.append("—")
            elif st["fail"]:
                cells.append(f"**{st['fail']} FAIL** of {len(rows)}")
            elif st["pass"] == len(rows):
                cells.append(f"yes ({len(rows)}/{len(rows)} pass)")
            elif st["skip"] + st["n/a"] == len(rows):
                cells.append(f"skipped ({st['skip']}/{len(rows)}; reasons below)")
            else:
                cells.append(f"{st['pass']}/{len(rows)} pass, {st['skip']} skip")
        glance.append([title] + cells)
    def short(e):
        v = e.get("versions", {})
        parts = [f"py {'.'.join(v.get('python', '?').split('.')[:2])}", f"torch {v.get('torch') or '—'}"]
        parts += [f"{label} {v[k]}" for k, label in (("mosaicml", "composer"), ("megatron-energon", "energon"))
                  if v.get(k)]
        return f"{e['name']} ({', '.join(parts)})"

    L += _table(["host contract", *[short(e) for e in envs]], glance) + [""]
    for host, title in m["hosts"].items():
        L += [f"## {title}", ""]
        rows = []
        for r in (r for r in m["rows"] if r["host"] == host):
            cells = []
            for n in names:
                c = r["cells"][n]
                text = _MARK[c["status"]]
                if c["reason"] and c["status"] != "n/a":
                    text += f": {c['reason']}"
                elif c["status"] == "pass":
                    text += f" ({len(c['tests'])})"
                cells.append(text)
            rows.append([f"`{r['id']}` {r['title']}"] + cells)
        L += _table(["contract item", *names], rows) + [""]
    L += ["## Evidence", "", "Every test behind every cell, with its outcome per environment "
          "(test ids as `python -m pytest <id>` takes them).", ""]
    for r in m["rows"]:
        ids = sorted({i for n in names for i in r["cells"][n]["tests"]})
        if not ids:
            L += [f"- `{r['id']}`: no test ran in any environment", ""]
            continue
        L += [f"<details><summary><code>{r['id']}</code>: {len(ids)} tests</summary>", ""]
        outcome = {e["name"]: {t["id"]: t for t in e["tests"]} for e in envs}
        trows = []
        for i in ids:
            cells = []
            for n in names:
                t = outcome[n].get(i) if i in r["cells"][n]["tests"] else None
                cells.append(_OUT[t["outcome"]] if t else "—")
            trows.append([f"`{i}`"] + cells)
        L += _table(["test", *names], trows) + ["", "</details>", ""]
    return "\n".join(L)


def dump_json(m: dict) -> str:
    return json.dumps(m, indent=1, sort_keys=False) + "\n"
