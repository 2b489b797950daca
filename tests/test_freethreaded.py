"""The vision-language pipeline on a free-threaded interpreter (3.13t): GIL off, identical global batches.

Marker ``freethreaded``; skipped, with the reason, where no free-threaded interpreter is found
(``benchmarks.freethreaded.find_freethreaded_python``: ``$ZEPHON_FT_PYTHON`` or the venv that
``bash scripts/freethreaded.sh`` builds). The data is written here (3.11: ``streaming.MDSWriter``,
``energon prepare``); a child on the free-threaded interpreter reads it with each runner
(``python -m benchmarks.child freethreaded.check``).
"""
from __future__ import annotations

import sys

import pytest

from benchmarks.freethreaded import find_freethreaded_python, run_child
from vl_data import natural_jpeg, sample_number, write_energon, write_mds

FT = find_freethreaded_python()
pytestmark = [pytest.mark.freethreaded,
              pytest.mark.skipif(FT is None, reason="no free-threaded interpreter: run `bash scripts/freethreaded.sh` "
                                                    "(builds ~/.cache/zephon-ft) or set ZEPHON_FT_PYTHON")]
N = 24
STEPS = 3


@pytest.fixture(scope="module")
def vl(tmp_path_factory):
    d = tmp_path_factory.mktemp("vl-ft")
    samples = {i: natural_jpeg(i) for i in range(N)}
    write_mds(str(d / "mds"), N, size_limit=1 << 19, samples=samples)
    write_energon(str(d / "energon"), N, per_shard=8, samples=samples)
    return {"samples": samples, "mds": str(d / "mds"), "energon": str(d / "energon")}


def expected_ids(caption: str, n: int = 64) -> list:
    ids = ([1] + [b + 3 for b in caption.encode("utf-8")] + [2])[:n]
    return ids + [0] * (n - len(ids))


@pytest.mark.parametrize("kind", ["mds", "energon"])
def test_identical_global_batches_across_runners_with_the_gil_off(vl, kind):
    cfg = {"kind": kind, "root": vl[kind], "steps": STEPS, "workers": 2}
    ft = run_child(FT, "check", cfg)
    assert "error" not in ft, ft.get("error")
    assert ft["gil_after_import"] is False and ft["gil_after_run"] is False, ft["python"]
    d = ft["digests"]
    assert set(d) == {"inline", "threads", "processes"}
    assert len(d["inline"]) == STEPS and len(set(d["inline"].values())) == STEPS
    assert d["threads"] == d["inline"] and d["processes"] == d["inline"]
    # the rows are the written samples: caption ids by the byte rule, computed here from what was written
    rows = ft["rows"]
    assert len(rows) == STEPS * 4 * 4  # steps x lanes x rows per lane (vl_loader defaults)
    for _, ids in rows:
        i = sample_number(bytes(t - 3 for t in ids if t >= 3).decode("utf-8", "replace"))
        assert ids == expected_ids(vl["samples"][i][1])
    # the same rows in the same order as this (3.11) interpreter's inline run: the order is the interpreter's
    # business no more than the runner's
    here = run_child(sys.executable, "check", {**cfg, "runners": ["inline"]})
    assert "error" not in here, here.get("error")
    assert here["rows"] == rows
