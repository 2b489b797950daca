"""pytest plugin the harness loads in each environment (``-p compat_matrix.pytest_plugin``).

``--contract-hosts a,b`` keeps only tests tagged ``@pytest.mark.contract`` with a row of those hosts;
``--compat-report PATH`` writes one JSON record per test: node id, contract rows, outcome
("passed" | "failed" | "skipped") and a one-line reason, plus collection errors. Without the options the
plugin does nothing, so loading it never changes a normal run.
"""
from __future__ import annotations

import json
import os
from pathlib import Path

import pytest


def pytest_addoption(parser):
    g = parser.getgroup("compat_matrix")
    g.addoption("--contract-hosts", default=None, help="comma-separated hosts: run only their contract tests")
    g.addoption("--compat-report", default=None, help="write per-test contract outcomes to this JSON file")


def contract_ids(item) -> list[str]:
    return [i for m in item.iter_markers("contract") for i in m.args]


def wanted_hosts(config) -> set[str] | None:
    """The hosts of ``--contract-hosts``, or None when the option is absent (no selection)."""
    hosts = config.getoption("--contract-hosts")
    return None if hosts is None else {h.strip() for h in hosts.split(",") if h.strip()}


def of_hosts(ids, wanted) -> bool:
    """Whether any contract row id in ``ids`` belongs to a host in ``wanted`` (None: every host)."""
    return wanted is None or any(i.split(".", 1)[0] in wanted for i in ids)


def pytest_configure(config):
    if config.getoption("--compat-report"):
        config.pluginmanager.register(_Recorder(config), "compat_matrix_recorder")


def pytest_collection_modifyitems(config, items):
    wanted = wanted_hosts(config)
    if wanted is None:
        return
    from .contracts import BY_ID

    unknown = sorted({f"{item.nodeid}: {i!r}" for item in items for i in contract_ids(item) if i not in BY_ID})
    if unknown:  # a typo would silently drop a test from the matrix
        raise pytest.UsageError("contract marks naming no row of compat_matrix/contracts.py: " + "; ".join(unknown))
    keep, drop = [], []
    for item in items:
        ids = contract_ids(item)
        (keep if of_hosts(ids, wanted) else drop).append(item)
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep


def one_line(text: str, limit: int = 200) -> str:
    """The first non-empty line of ``text``, shortened to ``limit`` characters."""
    for line in str(text).splitlines():
        line = line.strip()
        if line:
            return line if len(line) <= limit else line[: limit - 1] + "…"
    return ""


def _reason(report) -> str:
    if report.skipped:
        lr = report.longrepr
        msg = lr[2] if isinstance(lr, tuple) and len(lr) == 3 else str(lr)
        return one_line(msg.removeprefix("Skipped: "))
    crash = getattr(report.longrepr, "reprcrash", None)
    if crash is not None:
        return one_line(crash.message)
    # A collection error's text ends with the exception ("E   ModuleNotFoundError: ...").
    lines = [line.strip() for line in str(report.longrepr).splitlines() if line.strip()]
    return one_line(lines[-1].removeprefix("E").strip() if lines else "")


class _Recorder:
    def __init__(self, config):
        self.path = config.getoption("--compat-report")
        self.rootpath = config.rootpath
        self.tests: dict[str, dict] = {}
        self.unimported: dict[str, dict] = {}
        self.collect_errors: list[dict] = []
        self.hosts = wanted_hosts(config)
        self._tags: dict[Path, dict] = {}  # static tag map per test directory, read once

    def pytest_collection_finish(self, session):  # after deselection: the tests that will run
        for item in session.items:
            self.tests[item.nodeid] = {"id": item.nodeid, "contracts": contract_ids(item), "outcome": "not run",
                                       "reason": "", "seconds": 0.0}

    def pytest_collectreport(self, report):
        if not (report.failed or report.skipped):
            return
        reason = _reason(report)
        if report.failed:
            self.collect_errors.append({"id": report.nodeid, "reason": reason})
        # A module that skips or fails at import yields no items: its tests come from the static tag map.
        from .tagmap import collect_tags

        folder = (self.rootpath / report.nodeid).parent
        if folder not in self._tags:
            self._tags[folder] = collect_tags(folder, self.rootpath)[0]
        for tid, ids in self._tags[folder].items():
            if tid.split("::")[0] == report.nodeid and of_hosts(ids, self.hosts):
                self.unimported[tid] = {"id": tid, "contracts": ids, "seconds": 0.0, "reason": reason,
                                        "outcome": "failed" if report.failed else "skipped"}

    def pytest_runtest_logreport(self, report):
        rec = self.tests.get(report.nodeid)
        if rec is None:
            return
        rec["seconds"] = round(rec["seconds"] + report.duration, 3)
        if hasattr(report, "wasxfail"):  # a known failure of a contract is a failure of its row
            if rec["outcome"] != "failed":
                rec["outcome"] = "failed"
                rec["reason"] = f"expected failure (xfail): {one_line(report.wasxfail)}" if report.skipped else \
                    f"xpass: marked xfail ({one_line(report.wasxfail)}) but passed; remove the mark"
        elif report.failed:
            if rec["outcome"] != "failed":  # the first failing phase carries the cause
                rec["outcome"], rec["reason"] = "failed", _reason(report)
        elif report.skipped and rec["outcome"] == "not run":
            rec["outcome"], rec["reason"] = "skipped", _reason(report)
        elif report.when == "call" and report.passed and rec["outcome"] == "not run":
            rec["outcome"] = "passed"

    def pytest_sessionfinish(self, session, exitstatus):
        collected = [t for t in (*self.tests.values(), *self.unimported.values()) if t["contracts"]]
        out = {"exitstatus": int(exitstatus), "tests": collected, "collect_errors": self.collect_errors}
        tmp = self.path + ".tmp"
        with open(tmp, "w", encoding="utf-8") as fh:
            json.dump(out, fh, indent=1)
        os.replace(tmp, self.path)
