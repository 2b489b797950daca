"""Smoke test of the side-by-side benchmark suite: the quick data preparation and one tiny comparison.

Asserts the shape of the output (formats written, a result per configuration, equal token counts),
never a timing. Skipped where a peer library is missing.
"""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

pytest.importorskip("streaming")
pytest.importorskip("megatron.energon")
pytest.importorskip("webdataset")

REPO = Path(__file__).resolve().parent.parent


def test_quick_prepare_and_one_comparison(tmp_path):
    sys.path.insert(0, str(REPO))
    from benchmarks import report
    from benchmarks.common import run_child
    from benchmarks.prepare import prepare
    from zephon.demo_corpus import default_workdir

    m = prepare(os.environ.get("ZEPHON_DEMO_DIR") or default_workdir(), quick=True)
    assert m["docs"] == sum(m["per_dataset"]) > 0
    assert (Path(m["mds"]) / "index.json").exists()
    assert list(Path(m["wds"]).glob("*.tar")) and (Path(m["wds"]) / ".nv-meta" / "split.yaml").exists()
    assert all(len(fs) == 1 for fs in m["jsonl"] + m["parquet"])

    runs = {}
    for name, kind, cfg in (("zephon/inline", "throughput.peers.zephon", {"runner": "inline"}),
                            ("torch DataLoader/2 workers", "throughput.peers.torch", {"workers": 0})):
        res = run_child(kind, {**cfg, "manifest": m, "format": "jsonl"}, timeout=120)
        assert res and "error" not in res, res
        assert res["tokens"] > 0 and res["rows"] > 0 and res["rss_main_mib"] > 0
        runs[name] = [res]
    assert runs["zephon/inline"][0]["tokens"] == runs["torch DataLoader/2 workers"][0]["tokens"]

    R = {"machine": {"date": "d", "nproc": 2, "cpu": "c", "mem_gib": 1.0, "os": "o", "code": "x",
                     "load_before": 0.0, "versions": {"python": "3"}},
         "command": "python -m benchmarks --quick", "quick": True, "repeats": 1, "docs": m["docs"],
         "seconds": 1.0, "load_after": 0.0, "pipeline": {"jsonl": runs}}
    md, plots = report.render(json.loads(json.dumps(R)), img_dir=tmp_path, write_plots=False)
    assert report.BEGIN in md and report.END in md and "| zephon/inline |" in md
    assert "best Zephon / torch DataLoader" in md


def test_transport_table_has_every_transport():
    """benchmarks/transport.py (``--only transport``): inline, pickle and shared memory each carry every record."""
    from benchmarks.transport import measure_transport

    rows = measure_transport(units=2, records=4)
    assert [r[0] for r in rows] == ["inline (none)", "pickle", "shared memory"] and all(r[1] == 8 for r in rows)


def test_stall_table_has_every_configuration(capsys):
    """benchmarks/stall.py (``--only stall --quick``): one row per runner and adapter, each with a measured stall."""
    from benchmarks.stall import CONFIGS, main

    assert main(["--quick", "--steps", "2", "--warmup", "1", "--lanes", "4"]) == 0
    out = capsys.readouterr().out
    table = [line for line in out.splitlines() if line.startswith("| ")][1:]
    assert [row.split(" | ")[0][2:] for row in table] == list(CONFIGS)
    assert not [row for row in table if "failed" in row], table
    assert all(row.split(" | ")[4].endswith("%") for row in table)


def test_curricula_plots_a_few_steps_from_the_metrics(tmp_path):
    """benchmarks/curricula.py (``--only curricula --steps 5``): per-step counts from ``loader.metrics()`` (every step
    holds its 64 documents), plotted without the old crash of a run shorter than the smoothing window."""
    from benchmarks.curricula import main

    out, js = tmp_path / "curriculum.png", tmp_path / "curriculum.json"
    assert main(["--steps", "5", "--out", str(out), "--json", str(js)]) == 0
    result = json.loads(js.read_text())
    assert [sum(d) for d in result["docs"]] == [64] * 5 and all(min(t) > 0 for t in result["tokens"])
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
