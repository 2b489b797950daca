"""Checkpoint size and resume cost against training length and chunk size.

For each chunk size, one dp=1 run of the demo pipeline (64 lanes, tokenize + best-fit pack(2048) +
shuffle + batch, stdlib corpus) checkpoints at each listed step; then each checkpoint is restored into a
fresh loader and the time to its first global batch is compared with a cold start of the same loader.
Prints a table; asserts nothing (timings on shared 2-core machines are noisy: read the ratios).

    python -m benchmarks --only checkpoint-cost [--quick] [--workdir DIR] [--steps 150,1500]
                                                [--chunk-sizes 256,1024,16384] [--lanes 64]
"""
from __future__ import annotations

import argparse
import json
import time

from zephon.demo_corpus import build_corpus, build_tokenizer, default_workdir
from zephon.engine import Loader
from zephon.formats import open_dataset
from zephon.ops import Batch, Decode, Pack, Shuffle, Tokenize


def make(datasets, tok, chunk_size, lanes):
    ops = [Decode(), Tokenize(tok, eos_id="<eos>", max_length=2048), Pack(2048), Shuffle(32), Batch(1)]
    return Loader(datasets, ops, weights=[0.7, 0.3], canonical_replicas=lanes, chunk_size=chunk_size,
                  runner="threads", num_workers=2)


def first_step_seconds(loader) -> float:
    t0 = time.perf_counter()
    it = iter(loader)
    for _ in range(len(loader.lanes)):
        next(it)
    dt = time.perf_counter() - t0
    it.close()
    loader.close()
    return dt


def main(argv=None) -> int:
    """Run the table; ``argv``: the section's arguments (see the module doc). Returns 0."""
    p = argparse.ArgumentParser(prog="python -m benchmarks --only checkpoint-cost", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", default="150,1500")
    p.add_argument("--chunk-sizes", default="256,1024,16384")
    p.add_argument("--lanes", type=int, default=64)
    p.add_argument("--workdir", default=None)
    p.add_argument("--quick", action="store_true", help="steps 15,150 and chunk sizes 256,1024")
    a = p.parse_args(argv)
    if a.quick:
        a.steps, a.chunk_sizes = "15,150", "256,1024"
    steps = sorted(int(s) for s in a.steps.split(","))
    work = a.workdir or default_workdir()
    corpus = build_corpus(work)
    tok = build_tokenizer(work, [corpus["source_jsonl"], corpus["docstrings_jsonl"]])
    datasets = [open_dataset(corpus["source_jsonl"]), open_dataset(corpus["docstrings_jsonl"])]
    rows = []
    for cs in (int(c) for c in a.chunk_sizes.split(",")):
        cold = first_step_seconds(make(datasets, tok, cs, a.lanes))
        L = make(datasets, tok, cs, a.lanes)
        it = iter(L)
        states, done, t0 = {}, 0, time.perf_counter()
        for s in steps:
            for _ in range((s - done) * len(L.lanes)):
                next(it)
            done = s
            states[s] = (json.dumps(L.checkpoint()), time.perf_counter() - t0)
        it.close()
        L.close()
        for s in steps:
            blob, train_s = states[s]
            R = make(datasets, tok, cs, a.lanes)
            R.restore(json.loads(blob))
            restore = first_step_seconds(R)
            rows.append((cs, s, len(blob), train_s, cold, restore, R.stats()["replayed_rows"]))
            print(f"chunk_size={cs} step={s}: {len(blob)} bytes, restore {restore:.2f}s vs cold {cold:.2f}s",
                  flush=True)
    print(f"\n{a.lanes} lanes, global batch {a.lanes} x 2048 tokens, default flush span min(chunk_size, 256)")
    print(f"{'chunk_size':>10} {'step':>6} {'ckpt bytes':>10} {'run to step s':>14} {'cold start s':>12} "
          f"{'restore s':>10} {'ratio':>6} {'replayed rows':>13}")
    for cs, s, size, train_s, cold, restore, replayed in rows:
        print(f"{cs:>10} {s:>6} {size:>10} {train_s:>14.1f} {cold:>12.2f} {restore:>10.2f} "
              f"{restore / cold:>6.2f} {replayed:>13}")
    return 0
