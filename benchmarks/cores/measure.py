"""Cores per GPU: tokens per CPU-second of Zephon's demo pipeline with a 131,072-token BPE, and what they imply.

    python -m benchmarks --only cores [--quick] [--repeats 3] [--configs raw,inline,threads:1,...]
                                      [--tokenizer PATH] [--vocab-size 131072] [--lanes 64] [--headroom 1.2]

Each configuration runs one whole pass of the demo corpus through ``zephon demo``'s pipeline (Decode +
Tokenize(eos) + Pack(2048, best_fit) + Shuffle(32) + Batch(1, drop_last=False), 64 lanes, chunk 256; every
document once: ``exhaustion="quota"`` with each dataset's sample count as its weight, where the demo mixes
0.7/0.3) in a fresh subprocess, rounds interleaved. A whole pass, because then every token tokenized is a token
delivered: no work in flight at the end to mis-count, and the tokens equal ``raw``'s. CPU seconds are user +
system of the child, its threads and its worker processes (``resource.getrusage`` and ``/proc``,
``benchmarks.common.cpu_seconds``) from just before the loader is built to the end of the pass, so start-up
(opening the datasets, loading the 128k tokenizer, starting workers) counts; its own column gives the CPU seconds
to the first micro-batch (a long run amortizes them). ``raw``: the tokenizer alone, ``encode_batch_fast`` over the
same texts already in memory (batches of 256). Tokens are real tokens (``attention_mask``), not padding. Cores per
GPU for ``G`` tokens/s per GPU: ``G x headroom / (tokens per CPU-second)``. The tokenizer is
``benchmarks/cores/bpe.py``'s (trained once, cached under ~/.cache/zephon/bpe). Prints the table; writes nothing.
"""
from __future__ import annotations

import argparse
import os
import statistics
import time
from pathlib import Path

from benchmarks.common import cpu_seconds, markdown_table, run_child

CONFIGS = ("raw", "inline", "threads:1", "threads:2", "processes:1", "processes:2")
GPU_RATES = (50_000, 100_000, 200_000, 400_000)
SEQ = 2048


def _sources(data: list, quick: bool) -> list:
    """Per dataset, its folder, or with ``quick`` its first shard file."""
    return [[str(sorted(Path(d).glob("part-*.jsonl"))[0])] if quick else d for d in data]


def child_run(cfg: dict) -> dict:
    """One pass of ``cfg["config"]`` (``raw`` or ``runner:workers``); returns tokens, CPU and wall seconds."""
    import numpy as np
    from zephon.formats import open_dataset

    c0, t0 = cpu_seconds(), time.perf_counter()
    datasets = [open_dataset(s, name=n) for s, n in zip(_sources(cfg["data"], cfg["quick"]), ("source", "docs"))]
    if cfg["config"] == "raw":
        from tokenizers import Tokenizer

        texts = [r["text"] for ds in datasets for s in range(len(ds.shard_sizes))
                 for r in ds.read(s, list(range(ds.shard_sizes[s])))]
        c0, t0 = cpu_seconds(), time.perf_counter()  # reading is not the tokenizer's
        tok = Tokenizer.from_file(cfg["tokenizer"])
        encode = getattr(tok, "encode_batch_fast", tok.encode_batch)  # no offsets, as zephon.ops.Tokenize
        tokens, first = 0, cpu_seconds() - c0
        for i in range(0, len(texts), 256):
            ids = [e.ids for e in encode(texts[i:i + 256])]
            tokens += int(np.concatenate([np.asarray(x, np.int32) for x in ids]).size) + len(ids)  # + eos
        return {"tokens": tokens, "cpu_s": cpu_seconds() - c0, "wall_s": time.perf_counter() - t0,
                "first_cpu_s": first, "load": os.getloadavg()[0], "vocab": tok.get_vocab_size()}
    from zephon.engine import Loader
    from zephon.ops import Batch, Decode, Pack, Shuffle, Tokenize

    runner, workers = cfg["config"].split(":") if ":" in cfg["config"] else (cfg["config"], "1")
    tok = Tokenize(cfg["tokenizer"], eos_id="<eos>", max_length=SEQ)
    ops = [Decode(), tok, Pack(SEQ, method="best_fit"), Shuffle(32, seed=0), Batch(1, drop_last=False)]
    # every document exactly once (a quota of its dataset's size), so the tokens match ``raw``'s
    loader = Loader(datasets, ops, weights=[ds.num_samples for ds in datasets], seed=0,
                    canonical_replicas=cfg["lanes"], chunk_size=256, exhaustion="quota", runner=runner,
                    num_workers=int(workers))
    tokens, rows, first = 0, 0, None
    for mb in loader:
        first = cpu_seconds() - c0 if first is None else first
        tokens += int(mb["attention_mask"].sum())
        rows += len(mb["attention_mask"])
    cpu, wall = cpu_seconds() - c0, time.perf_counter() - t0  # before close: the workers are still ours to count
    loader.close()
    return {"tokens": tokens, "rows": rows, "cpu_s": cpu, "wall_s": wall, "first_cpu_s": first,
            "load": os.getloadavg()[0]}


def cores_per_gpu(rate: float, gpu_tokens_s: float, headroom: float) -> float:
    """Cores a GPU consuming ``gpu_tokens_s`` tokens/s needs from a pipeline of ``rate`` tokens per CPU-second,
    with ``headroom`` (loader throughput / consumption)."""
    return gpu_tokens_s * headroom / rate


def table(results: dict, headroom: float) -> str:
    """Markdown: per configuration, tokens per CPU-second median (min-max) over the rounds, and cores per GPU."""
    rows = []
    for name, runs in results.items():
        rs = [r for r in runs if r and "error" not in r]
        if not rs:
            err = str((runs[0] or {}).get("error", "")) if runs else "not run"
            rows.append([name, "failed: " + err[:60]] + ["-"] * (4 + len(GPU_RATES)))
            continue
        rates = [r["tokens"] / r["cpu_s"] for r in rs]
        med = statistics.median(rates)
        rows.append([name, f"{med / 1e6:.3f} ({min(rates) / 1e6:.3f}-{max(rates) / 1e6:.3f})",
                     f"{statistics.median(r['tokens'] / r['wall_s'] for r in rs) / 1e6:.3f}",
                     f"{statistics.median(r['cpu_s'] for r in rs):.1f}",
                     f"{statistics.median(r['first_cpu_s'] for r in rs):.1f}",
                     *[f"{cores_per_gpu(med, g, headroom):.2f}" for g in GPU_RATES],
                     " ".join(f"{r['load']:.1f}" for r in rs)])
    return markdown_table(["configuration<", "M tokens/CPU-s median (min-max)", "M tokens/wall-s", "CPU s/pass",
                           "of which to 1st batch", *[f"cores/GPU at {g // 1000}k" for g in GPU_RATES],
                           "load per round"], rows)


def main(argv=None) -> int:
    from zephon.demo_corpus import build_corpus, default_workdir

    from .bpe import VOCAB, build, manifest

    ap = argparse.ArgumentParser(prog="python -m benchmarks --only cores", description=__doc__.split("\n\n")[0])
    ap.add_argument("--workdir", default=default_workdir())
    ap.add_argument("--quick", action="store_true", help="1 round, the corpus' first shards")
    ap.add_argument("--repeats", type=int, default=None, help="interleaved rounds (default 3; 1 with --quick)")
    ap.add_argument("--configs", default=",".join(CONFIGS), help="comma-separated, from %(default)s")
    ap.add_argument("--tokenizer", default=None, help="tokenizer.json (default: the cached 128k BPE, trained "
                                                        "by benchmarks/cores/bpe.py if missing)")
    ap.add_argument("--vocab-size", type=int, default=VOCAB, help="the BPE to train when --tokenizer is not given")
    ap.add_argument("--lanes", type=int, default=64, help="canonical_replicas (default: the demo's %(default)s)")
    ap.add_argument("--headroom", type=float, default=1.2, help="loader throughput / GPU consumption")
    args = ap.parse_args(argv)
    configs = [c.strip() for c in args.configs.split(",") if c.strip()]
    bad = [c for c in configs if c not in CONFIGS]
    if bad:
        ap.error(f"unknown configuration(s) {bad}; choose from {CONFIGS}")
    tokenizer = args.tokenizer or str(build(vocab_size=args.vocab_size))
    from tokenizers import Tokenizer

    vocab = Tokenizer.from_file(tokenizer).get_vocab_size()
    dirs = build_corpus(args.workdir)
    cfg = {"data": [dirs["source_jsonl"], dirs["docstrings_jsonl"]], "tokenizer": tokenizer, "quick": args.quick,
           "lanes": args.lanes}
    repeats = args.repeats or (1 if args.quick else 3)
    m = manifest(tokenizer)
    trained = f" (trained on {m['bytes'] / 1e6:.0f} MB, {m['files']} files)" if m else ""
    print(f"# cores: {configs}, tokenizer {tokenizer}: {vocab} tokens{trained}; {args.lanes} lanes, "
          f"{'first shards' if args.quick else 'whole corpus'}, {repeats} rounds, headroom {args.headroom}, "
          f"nproc={os.cpu_count()}, load {os.getloadavg()[0]:.2f}", flush=True)
    results = {c: [] for c in configs}
    for rep in range(repeats):
        for c in configs[rep % len(configs):] + configs[:rep % len(configs)]:
            res = run_child("cores.measure.run", {**cfg, "config": c, "name": c}, timeout=900)
            results[c].append(res)
            if res and "error" not in res:
                print(f"  round {rep + 1}/{repeats} {c:>12}: {res['tokens']} tokens, {res['cpu_s']:.1f} CPU s, "
                      f"{res['tokens'] / res['cpu_s'] / 1e6:.3f} M tokens/CPU-s, load {res['load']:.2f}", flush=True)
    print()
    print(table(results, args.headroom))
    print(f"vocabulary {vocab}; cores per GPU = G x {args.headroom} / (tokens per CPU-second); "
          f"load average (1 min) at the end: {os.getloadavg()[0]:.2f} on {os.cpu_count()} CPUs")
    return 0
