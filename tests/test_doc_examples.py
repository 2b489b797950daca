"""The doc examples run as written: code blocks of README.md and docs/*.md marked ``<!-- runnable -->`` on the line
before their fence run on a demo corpus built here (a small one, at the default place under a temporary HOME);
every Python block binds the standard-library modules it uses (``os.replace`` without ``import os`` fails)."""
from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.S | re.M)


def blocks():
    """``(file, line, language, code, runnable)`` of every fenced block."""
    out = []
    for path in DOCS:
        text = path.read_text(encoding="utf-8")
        for m in FENCE.finditer(text):
            line = text.count("\n", 0, m.start()) + 1
            before = text[:m.start()].rstrip("\n").rsplit("\n", 1)[-1].strip()
            out.append((path.relative_to(ROOT).as_posix(), line, m.group(1), m.group(2), before == "<!-- runnable -->"))
    return out


RUNNABLE = [b for b in blocks() if b[4]]
PYTHON = [b for b in blocks() if b[2] == "python"]


def test_some_blocks_are_runnable():
    assert {b[2] for b in RUNNABLE} >= {"python", "bash"}


@pytest.mark.parametrize("block", PYTHON, ids=[f"{b[0]}:{b[1]}" for b in PYTHON])
def test_python_blocks_import_the_stdlib_modules_they_use(block):
    tree = ast.parse(block[3])
    bound = {a.asname or a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, (ast.Import, ast.ImportFrom))
             for a in n.names}
    bound |= {n.id for n in ast.walk(tree) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}
    used = {n.value.id for n in ast.walk(tree) if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name)}
    unbound = sorted(m for m in used - bound if m in sys.stdlib_module_names)
    assert not unbound, f"{block[0]} line {block[1]}: uses {unbound} without importing them"


@pytest.fixture(scope="module")
def demo_home(tmp_path_factory):
    """A HOME whose default demo folder holds a small demo corpus and the demo tokenizer; a ``.venv/bin/zephon``
    running this checkout (the README's commands name it)."""
    from zephon.demo_corpus import build_corpus, build_tokenizer

    home = tmp_path_factory.mktemp("home")
    work = home / ".cache" / "zephon" / "demo"
    corpus = build_corpus(work, limit_bytes=1 << 20)
    build_tokenizer(work, [corpus["source_jsonl"], corpus["docstrings_jsonl"]])
    venv = home / ".venv" / "bin"
    venv.mkdir(parents=True)
    (venv / "zephon").write_text(f"#!/bin/sh\nexec {sys.executable} -m zephon.cli \"$@\"\n")
    (venv / "zephon").chmod(0o755)
    return home


@pytest.mark.parametrize("block", RUNNABLE, ids=[f"{b[0]}:{b[1]}" for b in RUNNABLE])
def test_runnable_block_runs_as_written(block, demo_home):
    env = {k: v for k, v in os.environ.items() if k not in ("ZEPHON_DEMO_DIR", "ZEPHON_CACHE_DIR")}
    env.update(HOME=str(demo_home), PYTHONPATH=os.pathsep.join([str(ROOT), str(ROOT / "adapters")]))
    cmd = [sys.executable, "-c", block[3]] if block[2] == "python" else ["bash", "-euc", block[3]]
    r = subprocess.run(cmd, cwd=demo_home, env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, f"{block[0]} line {block[1]} failed:\n{r.stdout}\n{r.stderr}"


VERIFY = [b for b in blocks() if re.search(r"zephon verify ", b[3])]


@pytest.mark.parametrize("block", VERIFY, ids=[f"{b[0]}:{b[1]}" for b in VERIFY])
def test_verify_examples_name_their_tokenizer(block):
    """Without --tokenizer, verify uses the demo tokenizer of the default folder: an example on other data (or on
    a demo built with --workdir) would silently tokenize with something else."""
    for cmd in re.findall(r"zephon verify (?:.*\\\n)*.*", block[3]):
        assert "--tokenizer" in cmd, f"{block[0]} line {block[1]}: {cmd}"


def test_zephon_demo_runs_its_whole_job_on_a_small_corpus(demo_home, tmp_path):
    """``zephon demo`` (the README's first command ends with it) runs throughput and the elastic resume table to
    "OK" on the cached small corpus; every flag the demo shares with ``verify`` must exist on the demo too."""
    out = subprocess.run([str(demo_home / ".venv" / "bin" / "zephon"), "demo", "--seconds", "0.5",
                          "--canonical-replicas", "8", "--dp", "2", "--resume-dp", "4", "--checkpoint-step", "2",
                          "--steps", "4", "--max-length", "128"],
                         env={**os.environ, "HOME": str(demo_home), "PYTHONPATH": os.pathsep.join(sys.path)},
                         cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-3000:]
    assert "Elastic resume" in out.stdout and "OK" in out.stdout, out.stdout[-2000:]


def test_debugging_explain_command_reads_the_worked_examples_checkpoint(demo_home, tmp_path):
    """docs/debugging.md's `zephon explain 120 --checkpoint ckpt.json ...` runs as written on the checkpoint its
    worked example writes, and names the same documents (file:line) for step 120 as the example's Python explain."""
    doc = [b for b in blocks() if b[0] == "docs/debugging.md"]
    example = next(b[3] for b in doc if b[2] == "python" and '"ckpt.json"' in b[3])
    command = next(line for b in doc if b[2] == "bash" for line in b[3].splitlines()
                   if line.startswith("zephon explain 120 --checkpoint ckpt.json") and "..." not in line)
    env = {k: v for k, v in os.environ.items() if k not in ("ZEPHON_DEMO_DIR", "ZEPHON_CACHE_DIR")}
    env.update(HOME=str(demo_home), PYTHONPATH=os.pathsep.join([str(ROOT), str(ROOT / "adapters")]),
               PATH=os.pathsep.join([str(demo_home / ".venv" / "bin"), env.get("PATH", "")]))
    r = subprocess.run([sys.executable, "-c", example], cwd=tmp_path, env=env, capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stderr
    want = re.findall(r"^120 \d+ \w+ (\S+:\d+) ", r.stdout, re.M)
    assert len(want) >= 3
    c = subprocess.run(["bash", "-euc", command + " --no-progress"], cwd=tmp_path, env=env, capture_output=True,
                       text=True, timeout=300)
    assert c.returncode == 0, c.stderr
    for piece in want:
        assert f"/{piece} " in c.stdout, f"{piece} not in:\n{c.stdout}"
