"""Two demo-corpus builds started at once in two processes both succeed, and see the same files: built once, under
a file lock, published atomically (files once published never change under a reader). ``ZEPHON_CACHE_DIR`` moves
the demo folder. Oracle: the files' inode numbers and SHA-256 as each process saw them, and their rows read back."""
from __future__ import annotations

import json
import os
import subprocess
import sys

from zephon.demo_corpus import default_workdir

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
JOB = r"""
import hashlib, json, os, sys, time
from zephon import open_dataset
from zephon.demo_corpus import build_corpus, build_tokenizer, default_workdir



def files(work):
    out = {}
    for d, _, names in os.walk(work):
        for n in names:
            p = os.path.join(d, n)
            rel = os.path.relpath(p, work)
            if not any(part.startswith(".") for part in rel.split(os.sep)):  # not the lock nor line indexes
                out[rel] = [os.stat(p).st_ino, hashlib.sha256(open(p, "rb").read()).hexdigest()]
    return out


work = default_workdir()
corpus = build_corpus(work, limit_bytes=2 << 20)
first = files(work)  # what this process found once its build call returned
datasets = [open_dataset(corpus[k]) for k in ("source_jsonl", "docstrings_jsonl", "source_parquet")]
tok = build_tokenizer(work, [corpus["source_jsonl"], corpus["docstrings_jsonl"]], vocab_size=2048)
time.sleep(1.0)  # the other process is still building (without the lock) or reading
rows = [sum(len(ds.read(s, list(range(ds.shards[s].num_samples)))) for s in range(len(ds.shards))) for ds in datasets]
print(json.dumps({"work": work, "rows": rows, "first": first, "files": files(work)}))
"""


def test_two_concurrent_demo_builds_both_succeed_with_the_same_files(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "ZEPHON_DEMO_DIR"}
    env.update(ZEPHON_CACHE_DIR=str(tmp_path / "cache"), HOME=str(tmp_path / "home"),  # never the real ~/.cache
               PYTHONPATH=os.pathsep.join([ROOT, os.path.join(ROOT, "adapters")]))
    procs = [subprocess.Popen([sys.executable, "-c", JOB], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True) for _ in range(2)]
    outs = [p.communicate(timeout=300) for p in procs]
    for p, (out, err) in zip(procs, outs):
        assert p.returncode == 0, err
    a, b = (json.loads(out.strip().splitlines()[-1]) for out, _ in outs)
    assert a["files"] == b["files"]  # same inodes: one build, published once, never replaced under a reader
    def corpus(fs):
        return {k: v for k, v in fs.items() if not k.startswith("tokenizer")}
    assert corpus(a["first"]) == corpus(b["first"]) == corpus(a["files"])  # nothing changed once a process had it
    stamp = json.loads(open(os.path.join(a["work"], "corpus.json")).read())
    assert a["rows"] == b["rows"] == [stamp["source_docs"], stamp["docstring_docs"], stamp["source_docs"]]
    assert "tokenizer-bpe2048.json" in a["files"]
    assert a["work"] == b["work"] == str(tmp_path / "cache" / "demo")  # the demo folder follows ZEPHON_CACHE_DIR


def test_default_workdir_precedence(monkeypatch, tmp_path):
    monkeypatch.delenv("ZEPHON_DEMO_DIR", raising=False)
    monkeypatch.setenv("ZEPHON_CACHE_DIR", str(tmp_path / "c"))
    assert default_workdir() == str(tmp_path / "c" / "demo")
    monkeypatch.setenv("ZEPHON_DEMO_DIR", str(tmp_path / "d"))
    assert default_workdir() == str(tmp_path / "d")
