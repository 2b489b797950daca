"""Data set-up, once per scale: the stdlib corpus (``zephon.demo_corpus``: JSONL and Parquet, two
datasets ``source`` and ``docstrings``), its local BPE tokenizer, and the same documents as Mosaic MDS
shards (``streaming.MDSWriter``) and as a WebDataset (``webdataset.ShardWriter``) prepared by the real
``energon prepare`` CLI. ``quick`` uses the first of the four shards of each dataset (about 1/4).

Everything lands under ``<workdir>/bench-<scale>/`` and is reused when its manifest is present.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

MANIFEST = "manifest.json"
VERSION = 3


def _files(d: str, ext: str, quick: bool) -> list[str]:
    fs = sorted(str(p) for p in Path(d).glob(f"part-*.{ext}"))
    return fs[:1] if quick else fs


def prepare(workdir: str, quick: bool, log=print) -> dict:
    from zephon.demo_corpus import build_corpus, build_tokenizer

    t0 = time.perf_counter()
    dirs = build_corpus(workdir)
    tok = build_tokenizer(workdir, [dirs["source_jsonl"], dirs["docstrings_jsonl"]])
    root = Path(workdir) / f"bench-{'quick' if quick else 'full'}"
    mpath = root / MANIFEST
    if mpath.exists():
        m = json.loads(mpath.read_text())
        if m.get("version") == VERSION and all(os.path.exists(p) for p in (m["mds"], m["wds"], m["tokenizer"])):
            m["prepare_seconds"] = 0.0
            return m
    shutil.rmtree(root, ignore_errors=True)
    root.mkdir(parents=True)
    m = {"version": VERSION, "root": str(root), "tokenizer": tok, "names": ["source", "docstrings"],
         "jsonl": [_files(dirs[f"{n}_jsonl"], "jsonl", quick) for n in ("source", "docstrings")],
         "parquet": [_files(dirs[f"{n}_parquet"], "parquet", quick) for n in ("source", "docstrings")]}
    docs = []  # (key, text), dataset by dataset, file by file
    for name, files in zip(m["names"], m["jsonl"]):
        for f in files:
            with open(f, encoding="utf-8") as fh:
                for line in fh:
                    if line.strip():
                        docs.append((f"{name[:3]}{len(docs):06d}", json.loads(line)["text"]))
    m["docs"] = len(docs)
    m["per_dataset"] = [sum(1 for f in files for line in open(f, encoding="utf-8") if line.strip())
                        for files in m["jsonl"]]

    # Mosaic MDS, written by the real writer. Shards of ~1 MiB so that 2 workers have several each.
    from streaming import MDSWriter

    mds = root / "mds"
    with MDSWriter(out=str(mds), columns={"text": "str", "key": "str"}, size_limit=1 << 20) as w:
        for key, text in docs:
            w.write({"text": text, "key": key})
    m["mds"] = str(mds)

    # WebDataset tars (webdataset.ShardWriter), then `energon prepare` (its CLI, non-interactive).
    import webdataset as wds

    wroot = root / "wds"
    wroot.mkdir()
    per_tar = max(64, len(docs) // 16)
    with wds.ShardWriter(str(wroot / "docs-%04d.tar"), maxcount=per_tar, verbose=0) as w:
        for key, text in docs:
            w.write({"__key__": key, "txt": text})
    exe = os.path.join(os.path.dirname(sys.executable), "energon")
    subprocess.run([exe, "prepare", "--non-interactive", "--no-progress", "--num-workers", "1",
                    "--sample-type", "TextSample", "--field-map", json.dumps({"text": "txt"}),
                    "--split-parts", "train:.*", str(wroot)], check=True, stdout=subprocess.DEVNULL,
                   stderr=subprocess.PIPE)
    m["wds"] = str(wroot)
    m["prepare_seconds"] = time.perf_counter() - t0
    mpath.write_text(json.dumps(m, indent=1))
    log(f"prepared {len(docs)} documents as JSONL, Parquet, MDS ({len(list(mds.glob('*.mds')))} shards) and "
        f"WebDataset ({len(list(wroot.glob('*.tar')))} tars, energon-prepared) in {m['prepare_seconds']:.1f} s "
        f"under {root}")
    return m
