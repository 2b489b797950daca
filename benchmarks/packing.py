"""Packing efficiency: padding of tokenize + pack(2048) over one whole pass, Zephon against Grain's packers.

Two corpora made from the embedded demo corpus (``zephon.demo_corpus``, the stdlib): ``short``, its
documents cut at blank lines (paragraphs, docstrings: about 60-100 tokens each), and ``long``, whole
stdlib files (many longer than 2048 tokens, split by ``Tokenize(max_length=2048)``). For each: Zephon's
defaults (8 lanes, ``Pack(2048)``), Zephon's earlier defaults (8 open bins, no carry: every flush
sentinel pads the open bins out), a larger-buffer Zephon setting, and Grain's ``BestFitPackIterDataset``
/ ``FirstFitPackIterDataset`` on the same token sequences. ``padding %`` = padded tokens / row tokens;
``bound`` = ceil(tokens / 2048), the fewest rows any packer can use. ``steady padding %``: the first
2 x bound rows of the endless stream (repeating passes), where no pass ends (each lane's last partly
filled rows are not paid). Also the size of a Zephon checkpoint
at 64 lanes mid-pass (JSON bytes, carried documents included).

    python -m benchmarks --only packing [--quick]

Prints a table; asserts nothing.
"""
from __future__ import annotations

import json
import math
import os
import time
from pathlib import Path

MAX_LEN = 2048


def corpora(workdir: str, quick: bool) -> dict:
    """``{name: jsonl path}``: the short- and long-document corpora, written once under ``workdir``."""
    from zephon.demo_corpus import build_corpus

    dirs = build_corpus(workdir)
    root = Path(workdir) / f"packing-{'quick' if quick else 'full'}"
    out = {"short": root / "short.jsonl", "long": root / "long.jsonl"}
    if all(p.exists() for p in out.values()):
        return {k: str(v) for k, v in out.items()}
    root.mkdir(parents=True, exist_ok=True)
    files = sorted(Path(dirs["source_jsonl"]).glob("*.jsonl")) + sorted(Path(dirs["docstrings_jsonl"]).glob("*.jsonl"))
    docs = [json.loads(line) for f in files[:2 if quick else None] for line in open(f, encoding="utf-8")
            if line.strip()]
    by_file: dict[str, list[str]] = {}
    short = []
    for d in docs:
        short.extend(p for p in d["text"].split("\n\n") if len(p.strip()) > 40)
        by_file.setdefault(d.get("file", ""), []).append(d["text"])
    long_docs = ["\n\n\n".join(parts) for parts in by_file.values()]
    for name, texts in (("short", short), ("long", long_docs)):
        tmp = str(out[name]) + ".tmp"
        with open(tmp, "w", encoding="utf-8") as fh:
            for t in texts:
                fh.write(json.dumps({"text": t}) + "\n")
        os.replace(tmp, out[name])
    return {k: str(v) for k, v in out.items()}


def zephon_pass(path: str, tok: str, lanes: int = 8, steady_rows: int = 0, **pack_kw) -> dict:
    """One finite pass of the default text pipeline: rows (padding rows of the last step excluded), real
    tokens. With ``steady_rows``: instead the first ``steady_rows`` rows of the endless stream (no pass end)."""
    from zephon import Batch, Decode, Loader, Pack, Tokenize, open_dataset

    ops = [Decode(), Tokenize(tok, eos_id="<eos>", max_length=MAX_LEN), Pack(MAX_LEN, **pack_kw),
           Batch(1, drop_last=False)]
    rows = tokens = 0
    t0 = time.perf_counter()
    with Loader([open_dataset(path)], ops, canonical_replicas=lanes, exhaustion="repeat" if steady_rows else "stop",
                runner="threads", num_workers=2) as L:
        for mb in L:
            real = len(mb["input_ids"]) - mb.get("__pad__", 0)
            rows += real
            tokens += int(mb["attention_mask"].sum())
            if steady_rows and rows >= steady_rows:
                break
    return {"rows": rows, "tokens": tokens, "seconds": time.perf_counter() - t0}


def token_lists(path: str, tok: str) -> list:
    """The documents' token ids as Zephon's Tokenize makes them (eos appended, split at 2048)."""
    from tokenizers import Tokenizer

    t = Tokenizer.from_file(tok)
    eos = t.token_to_id("<eos>")
    texts = [json.loads(line)["text"] for line in open(path, encoding="utf-8") if line.strip()]
    out = []
    for enc in t.encode_batch(texts, add_special_tokens=False):
        ids = enc.ids + [eos]
        out.extend(ids[i:i + MAX_LEN] for i in range(0, len(ids), MAX_LEN))
    return out


def grain_pass(seqs: list, cls_name: str, bins: int, steady_rows: int = 0) -> dict:
    """Grain's packer over the same sequences: one pass, or the first ``steady_rows`` rows of a repeat."""
    import numpy as np
    import grain.experimental as ge
    from grain import MapDataset

    src = MapDataset.source([{"input_ids": np.asarray(s, dtype=np.int32)} for s in seqs])
    ds = (src.repeat(None) if steady_rows else src).to_iter_dataset()
    cls = getattr(ge, cls_name)
    packed = cls(ds, length_struct={"input_ids": MAX_LEN}, num_packing_bins=bins, shuffle_bins=False)
    rows = tokens = 0
    t0 = time.perf_counter()
    for row in packed:
        rows += 1
        tokens += int((row["input_ids_segment_ids"] > 0).sum())
        if steady_rows and rows >= steady_rows:
            break
    return {"rows": rows, "tokens": tokens, "seconds": time.perf_counter() - t0}


def checkpoint_bytes(path: str, tok: str, lanes: int = 64, steps: int = 5) -> int:
    """JSON size of a dp=1 checkpoint over ``lanes`` lanes after ``steps`` global steps (carry included)."""
    from zephon import Batch, Decode, Loader, Pack, Tokenize, open_dataset

    ops = [Decode(), Tokenize(tok, eos_id="<eos>", max_length=MAX_LEN), Pack(MAX_LEN), Batch(1)]
    with Loader([open_dataset(path)], ops, canonical_replicas=lanes, chunk_size=64, runner="threads",
                num_workers=2) as L:
        it = iter(L)
        for _ in range(steps * lanes):
            next(it)
        state = L.checkpoint()
        it.close()
    return len(json.dumps(state))


def run(workdir: str, quick: bool, log=print) -> list[dict]:
    from zephon.demo_corpus import build_corpus, build_tokenizer

    paths = corpora(workdir, quick)
    dirs = build_corpus(workdir)
    dirs_tok = build_tokenizer(workdir, [dirs["source_jsonl"], dirs["docstrings_jsonl"]])
    rows = []
    for name, path in paths.items():
        seqs = token_lists(path, dirs_tok)
        total = sum(len(s) for s in seqs)
        base = {"corpus": name, "documents": sum(1 for line in open(path) if line.strip()),
                "mean tokens": round(total / max(1, len(seqs)), 1), "bound": math.ceil(total / MAX_LEN)}
        steady = 2 * base["bound"]
        runs = [("zephon defaults (32 bins, carry 64)", lambda **k: zephon_pass(path, dirs_tok, **k)),
                ("zephon earlier defaults (8 bins, no carry)",
                 lambda **k: zephon_pass(path, dirs_tok, max_open_bins=8, max_carry=0, **k)),
                ("zephon 128 bins, carry 256",
                 lambda **k: zephon_pass(path, dirs_tok, max_open_bins=128, max_carry=256, **k)),
                ("grain BestFitPackIterDataset (32 bins)",
                 lambda **k: grain_pass(seqs, "BestFitPackIterDataset", 32, **k)),
                ("grain FirstFitPackIterDataset (32 bins)",
                 lambda **k: grain_pass(seqs, "FirstFitPackIterDataset", 32, **k)),
                ("grain BestFitPackIterDataset (128 bins)",
                 lambda **k: grain_pass(seqs, "BestFitPackIterDataset", 128, **k))]
        for label, fn in runs:
            log(f"packing: {name} / {label}")
            r = fn()
            if r["tokens"] != total:
                raise RuntimeError(f"{label} delivered {r['tokens']} tokens of {total} on {name}")
            s = fn(steady_rows=steady)
            rows.append(dict(base, packer=label, rows=r["rows"], tokens=r["tokens"],
                             **{"padding %": round(100 * (1 - r["tokens"] / (r["rows"] * MAX_LEN)), 3),
                                "steady padding %": round(100 * (1 - s["tokens"] / (s["rows"] * MAX_LEN)), 3)}))
        rows[-1]["ckpt bytes @64 lanes"] = checkpoint_bytes(path, dirs_tok)
    return rows


def table(rows: list[dict]) -> str:
    cols = ["corpus", "documents", "mean tokens", "packer", "rows", "bound", "padding %", "steady padding %"]
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    lines += ["| " + " | ".join(str(r[c]) for c in cols) + " |" for r in rows]
    ck = [f"- checkpoint at 64 lanes, {r['corpus']} corpus, defaults: {r['ckpt bytes @64 lanes']} bytes of JSON"
          for r in rows if "ckpt bytes @64 lanes" in r]
    return "\n".join(lines + [""] + ck)


def main(workdir: str, quick: bool) -> str:
    out = table(run(workdir, quick))
    print(out)
    return out
