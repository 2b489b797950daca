"""The repository's ruff configuration ([tool.ruff] in pyproject.toml: line length, pyflakes, complexity) passes."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _ruff() -> str:
    here = os.path.join(os.path.dirname(sys.executable), "ruff")  # the venv's, pinned in the dev extra
    found = here if os.path.exists(here) else shutil.which("ruff")
    assert found, "ruff is not installed: it is part of the dev extra (pip install -e '.[dev]')"
    return found


def test_ruff_passes_on_the_repository():
    out = subprocess.run([_ruff(), "check", "--no-cache", "."], cwd=ROOT, capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr


def test_ruff_configuration_catches_a_violation(tmp_path):
    """The configuration is live: a long line and an unused import in a scratch file are reported."""
    bad = tmp_path / "bad.py"
    bad.write_text("import os\n" + "x = '" + "a" * 130 + "'\n")
    out = subprocess.run([_ruff(), "check", "--no-cache", "--config", os.path.join(ROOT, "pyproject.toml"), str(bad)],
                         capture_output=True, text=True)
    assert out.returncode == 1 and "E501" in out.stdout and "F401" in out.stdout, out.stdout + out.stderr


def test_core_and_adapters_keep_complexity_at_most_12(tmp_path):
    """zephon/ and adapters/ have their own ruff.toml (extending pyproject.toml) with max-complexity 12: a
    function of complexity 13 is reported there and not under the repository's own limit."""
    branches = "".join(f"    if x == {i}:\n        return {i}\n" for i in range(12))
    bad = tmp_path / "complex.py"
    bad.write_text(f"def f(x):\n{branches}    return -1\n")  # 12 ifs: complexity 13
    for folder in ("zephon", "adapters"):
        out = subprocess.run([_ruff(), "check", "--no-cache", "--config", os.path.join(ROOT, folder, "ruff.toml"),
                              str(bad)], capture_output=True, text=True)
        assert out.returncode == 1 and "C901" in out.stdout and "(13 > 12)" in out.stdout, out.stdout + out.stderr
    out = subprocess.run([_ruff(), "check", "--no-cache", "--config", os.path.join(ROOT, "pyproject.toml"), str(bad)],
                         capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr
