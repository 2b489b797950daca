"""Zephon side by side with Grain, Mosaic Streaming, Energon and torch's DataLoader (comparisons 1-6).

    python -m benchmarks [--quick] [--only pipeline,mds,energon,checkpoints,divergence,lanes] [--repeats N]
                         [--workdir DIR] [--no-write]

Prepares the data once (``benchmarks.prepare``), runs each comparison (every configuration and
repetition in its own subprocess; repetitions interleaved in an order rotated each round, so drift on a
shared machine hits every configuration alike), prints the tables of medians and ratios, and (full
run, unless ``--no-write``) writes them with the machine, the date, the exact command and the plots
into docs/benchmarks.md (between the ``side-by-side`` markers) and docs/img/. ``--quick``: a quarter
of the corpus, 1 repetition, fewer steps, no Streaming divergence run: about 3 minutes on 2 busy cores.
Prints only; asserts nothing.
"""
from __future__ import annotations

import json
import os
import time
from pathlib import Path

from . import report
from .common import REPO, machine, run_child
from .prepare import prepare


def log(msg: str) -> None:
    print(msg, flush=True)


def interleaved(configs: list[tuple[str, str, dict]], repeats: int, base: dict, tag: str) -> dict:
    """Run every (name, kind, cfg) ``repeats`` times, rotating the order each round."""
    out = {name: [] for name, _, _ in configs}
    for rep in range(repeats):
        k = rep % len(configs)
        for name, kind, cfg in configs[k:] + configs[:k]:
            t0 = time.perf_counter()
            res = run_child(kind, {**base, **cfg}, log=log)
            out[name].append(res)
            if res and "error" not in res:
                rate = res.get("rate")
                log(f"  [{tag}] round {rep + 1}/{repeats} {name:<28} {rate / 1e3 if rate else 0:10.1f} k/s  "
                    f"({time.perf_counter() - t0:.1f} s)")
    return out


def pipeline_configs(quick: bool):
    cfgs = [("zephon/inline", "throughput.peers.zephon", {"runner": "inline"}),
            ("zephon/threads", "throughput.peers.zephon", {"runner": "threads"}),
            ("zephon/processes", "throughput.peers.zephon", {"runner": "processes"}),
            ("grain/mp2, batch encode", "throughput.peers.grain", {"encode": "batch", "worker_buffer": 8}),
            ("grain/threads, batch encode", "throughput.peers.grain", {"encode": "batch", "workers": 0,
                                                               "tok_parallel": True}),
            ("grain/mp2, per-doc encode", "throughput.peers.grain", {"encode": "doc", "worker_buffer": 8}),
            ("torch DataLoader/2 workers", "throughput.peers.torch", {})]
    if quick:
        cfgs = [c for c in cfgs if c[0] not in ("zephon/inline", "grain/mp2, per-doc encode")]
    return cfgs


def run(args, only: set[int], command: str) -> int:
    """Run the side-by-side comparisons ``only`` (numbers 1-6), print their tables, write docs on a full run.

    args: the entry point's options (quick, repeats, workdir, no_write, write, results, from_results).
    only: the comparisons to run, by number. command: the command line, recorded with the tables.
    """
    if args.from_results:
        R = json.loads(Path(args.from_results).read_text())
        md, plots = report.render(R, img_dir=REPO / "docs" / "img", write_plots=not args.no_write)
        print(md)
        if not args.no_write:
            report.write_doc(REPO / "docs" / "benchmarks.md", md)
        return 0
    repeats = args.repeats or (1 if args.quick else 3)
    t_start = time.perf_counter()
    info = machine()
    log(f"# {command}\n# {info['date']}, nproc={info['nproc']}, {info['cpu']}, code {info['code']}, "
        f"load {info['load_before']:.2f}")
    m = prepare(args.workdir, args.quick, log=log)
    log(f"# data: {m['docs']} documents ({m['per_dataset']} source/docstrings)")
    R = {"machine": info, "command": command, "quick": args.quick, "repeats": repeats, "docs": m["docs"]}

    if 1 in only:
        log("## 1. tokenize + pack(2048) + batch(8): tokens/s")
        R["pipeline"] = {}
        for fmt in (("jsonl",) if args.quick else ("jsonl", "parquet")):
            cfgs = pipeline_configs(args.quick)
            if fmt == "parquet":  # the best of each peer on the second format
                cfgs = [c for c in cfgs if c[0] in ("zephon/threads", "zephon/processes", "grain/mp2, batch encode",
                                                    "grain/threads, batch encode", "torch DataLoader/2 workers")]
            R["pipeline"][fmt] = interleaved(cfgs, repeats if fmt == "jsonl" else max(1, repeats - 1),
                                             {"manifest": m, "format": fmt}, f"1/{fmt}")
    if 2 in only:
        log("## 2. MDS: samples/s")
        R["mds"] = interleaved([("streaming.StreamingDataset", "formats.mds", {"impl": "mosaic"}),
                                ("zephon_streaming.StreamingDataset", "formats.mds", {"impl": "zephon"})],
                               repeats, {"manifest": m}, "2")
    if 3 in only:
        log("## 3. Energon: samples/s")
        R["energon"] = interleaved([("megatron.energon", "formats.energon", {"impl": "energon"}),
                                    ("zephon_energon", "formats.energon", {"impl": "zephon"}),
                                    ("megatron.energon + tokenize", "formats.energon",
                                     {"impl": "energon", "task_encoder": "tokenize"}),
                                    ("zephon_energon + tokenize", "formats.energon",
                                     {"impl": "zephon", "task_encoder": "tokenize"})],
                                   repeats, {"manifest": m}, "3")
    if 4 in only:
        steps = [100, 1000] if args.quick else [100, 1000, 10000]
        log(f"## 4. checkpoints at steps {steps}")
        R["checkpoints"] = {}
        for impl in ("zephon", "grain", "torchdata", "energon", "streaming"):
            t0 = time.perf_counter()
            R["checkpoints"][impl] = run_child("checkpoints.peers.run", {"impl": impl, "manifest": m, "steps": steps},
                                               log=log, timeout=900)
            log(f"  [4] {impl}: {time.perf_counter() - t0:.1f} s")
    if 5 in only:
        k, H = (20, 20) if args.quick else (50, 50)
        log(f"## 5. divergence: checkpoint at step {k} on 4 ranks, resume on 2 and 8, {H} steps compared")
        R["divergence"] = {}
        # Streaming needs one process per rank launched together (about 1 minute on 2 cores): full run only.
        for impl in ("zephon", "distributed_sampler", "grain", "energon") + (() if args.quick else ("streaming",)):
            Ms = [2, 8]
            t0 = time.perf_counter()
            R["divergence"][impl] = run_child("divergence.run", {"impl": impl, "manifest": m, "N": 4, "Ms": Ms,
                                                                 "k": k, "H": H}, log=log, timeout=900)
            log(f"  [5] {impl}: {time.perf_counter() - t0:.1f} s")
    if 6 in only:
        lanes = [8, 64, 256] if args.quick else [8, 64, 256, 1024]
        log(f"## 6. Zephon lanes scaling {lanes}")
        cfgs = [(f"{n} lanes", "throughput.peers.zephon", {"runner": "threads", "lanes": n,
                                                   "chunk_size": max(1, min(1024, m["docs"] // n // 2))})
                for n in lanes]
        R["scaling"] = interleaved(cfgs, 1 if args.quick else 2, {"manifest": m, "format": "jsonl"}, "6")

    R["seconds"] = time.perf_counter() - t_start
    R["load_after"] = os.getloadavg()[0]
    md, plots = report.render(R, img_dir=REPO / "docs" / "img", write_plots=not args.no_write)
    print()
    print(md)
    if args.results:
        Path(args.results).write_text(json.dumps(R, indent=1, default=str))
    if not args.no_write and (not args.quick or args.write):
        report.write_doc(REPO / "docs" / "benchmarks.md", md)
        log(f"wrote docs/benchmarks.md and {len(plots)} plots in docs/img/")
    log(f"total {R['seconds']:.0f} s")
    return 0
