"""A data curriculum on the demo corpus: realised per-dataset shares per global step against the schedule.

``python -m benchmarks --only curricula [--steps 300] [--out docs/img/curriculum.png] [--json out.json]``

A real ``zephon.Loader`` (8 lanes, one document per row, 64 rows per global step) reads the demo corpus's
Python sources and docstrings under a three-phase ``Schedule``: 90/10 (by tokens) until step 100, a linear
ramp to 30/70 at step 200, held, then 50/50 from step 250. The schedule allocates *documents*; to target
*token* shares, each dataset's weights are divided by its mean document length (measured once on a seeded
sample, as ``ops.token_corrected_weights`` does), at knots every 10 steps (``document_schedule``). The loader
tokenizes with the demo tokenizer; after every global step the script reads ``loader.metrics()`` (per dataset,
the documents and tokens delivered so far) and plots, per step, each dataset's realised token share and document
share (the differences of those counts) against the schedule. See docs/curricula.md.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

TOKEN_SHARES = [  # per dataset, Energon PR #208 style: target *token* weights by global step
    {"linear": {0: 9, 100: 9, 200: 3, 249: 3, 250: 5}},
    {"linear": {0: 1, 100: 1, 200: 7, 249: 7, 250: 5}},
]
NAMES = ("Python sources", "docstrings")


def document_schedule(token_specs, per_token, steps: int, every: int = 10):
    """Document weights whose token shares follow ``token_specs``: the token shares at knots every ``every``
    steps (and at the specs' own keys, with the step before each, so jumps stay jumps), divided by each
    dataset's mean document length. A linear document ramp is not a linear token ramp (the token share is a
    ratio): knots every few steps keep the difference small."""
    from zephon import Schedule

    tokens = Schedule(token_specs)
    keys = {int(k) for s in token_specs for k in next(iter(s.values()))}
    knots = sorted(set(range(0, steps + 1, every)) | keys | {k - 1 for k in keys if k > 0})
    return [{"linear": {k: float(tokens.shares(k)[d]) * per_token[d] for k in knots}} for d in range(len(token_specs))]


def share_at(specs, step):
    """Target shares at ``step`` under Zephon's reading of ``specs`` (exact; from the Schedule itself)."""
    from zephon import Schedule
    return [float(x) for x in Schedule(specs).shares(step)]


def run(steps: int, lanes: int = 8, gbs: int = 64, seed: int = 0):
    from tokenizers import Tokenizer

    from zephon import Batch, Decode, Loader, Schedule, Tokenize, open_dataset
    from zephon.demo_corpus import build_corpus, build_tokenizer, default_workdir
    from zephon.ops import token_corrected_weights

    workdir = default_workdir()
    corpus = build_corpus(workdir)
    tok_path = build_tokenizer(workdir, [corpus["source_jsonl"], corpus["docstrings_jsonl"]])
    tok = Tokenizer.from_file(str(tok_path))
    datasets = [open_dataset(corpus["source_jsonl"]), open_dataset(corpus["docstrings_jsonl"])]

    def count(recs):
        return [len(e.ids) for e in tok.encode_batch([r["text"] for r in Decode("text").process_many(recs)])]
    per_token = token_corrected_weights(datasets, [1, 1], count, seed=seed)  # ∝ 1 / mean tokens per document
    doc_specs = document_schedule(TOKEN_SHARES, per_token, steps)
    loader = Loader(datasets, [Decode("text"), Tokenize(tok, add_eos=False), Batch(gbs // lanes)],
                    weights=Schedule(doc_specs), seed=seed, canonical_replicas=lanes, chunk_size=64,
                    global_batch_size=gbs, runner="inline")
    docs, tokens = [], []
    seen = [[0, 0], [0, 0]]  # documents and tokens delivered before this step, per dataset
    t0 = time.perf_counter()
    it = iter(loader)
    for step in range(steps):
        for _ in range(lanes):  # one micro-batch per lane: the whole global step
            mb = next(it)
            assert mb["__step__"] == step
        now = [[d["samples"], d["tokens"]] for d in loader.metrics()["datasets"].values()]
        docs.append([now[d][0] - seen[d][0] for d in range(2)])
        tokens.append([now[d][1] - seen[d][1] for d in range(2)])
        seen = now
    loader.close()
    elapsed = time.perf_counter() - t0
    return {"steps": steps, "lanes": lanes, "global_batch_size": gbs, "seconds": elapsed,
            "docs": docs, "tokens": tokens, "token_specs": TOKEN_SHARES, "doc_specs": doc_specs,
            "target_token_share": [share_at(TOKEN_SHARES, s) for s in range(steps)],
            "target_doc_share": [share_at(doc_specs, s) for s in range(steps)]}


def plot(result: dict, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    steps = np.arange(result["steps"])
    tokens, docs = np.asarray(result["tokens"], float), np.asarray(result["docs"], float)
    tshare = tokens / tokens.sum(1, keepdims=True)
    dshare = docs / docs.sum(1, keepdims=True)
    window = max(1, min(10, len(steps)))  # a run of fewer steps than the window smooths over all of them
    smooth = np.convolve(tshare[:, 1], np.ones(window) / window, mode="valid")  # steps [k, k + window)
    fig, (ax1, ax2) = plt.subplots(2, 1, figsize=(9, 6.4), sharex=True)
    colors = ("tab:blue", "tab:orange")
    for d in range(2):
        ax1.plot(steps, tshare[:, d], color=colors[d], alpha=0.35, lw=0.8)
        ax1.plot(steps, [t[d] for t in result["target_token_share"]], color=colors[d], ls="--", lw=1.6,
                 label=f"{NAMES[d]}: schedule")
        ax2.plot(steps, dshare[:, d], color=colors[d], lw=1.0, label=f"{NAMES[d]}: realised")
        ax2.plot(steps, [t[d] for t in result["target_doc_share"]], color="k", ls=":", lw=1.0)
    ax1.plot(steps[:smooth.size] + (window - 1) / 2, smooth, color="tab:red", lw=1.4,
             marker="o" if smooth.size < 3 else None, label=f"docstrings: realised, {window}-step mean")
    ax1.set_ylabel("token share per global step")
    ax1.set_title("Realised token share per step (thin: each step) against the schedule (dashed)")
    ax1.legend(fontsize=8, loc="best")
    ax2.set_ylabel("document share per step")
    ax2.set_xlabel("global step (64 documents)")
    ax2.set_title("Document share: what the schedule allocates, within 1 document per step of it (dotted)")
    ax2.legend(fontsize=8, loc="best")
    for ax in (ax1, ax2):
        for x in (100, 200, 250):
            if x < steps.size:  # the phase changes this run reached
                ax.axvline(x, color="0.8", lw=0.8, zorder=0)
        ax.set_ylim(0, 1)
        ax.set_xlim(0, max(1, steps.size - 1))
    fig.tight_layout()
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)


def summary(result: dict) -> dict:
    """Mean absolute deviation of the realised shares from the targets, per phase."""
    import numpy as np

    tokens, docs = np.asarray(result["tokens"], float), np.asarray(result["docs"], float)
    tshare = tokens / tokens.sum(1, keepdims=True)
    doc_err = np.abs(docs - np.asarray(result["target_doc_share"]) * result["global_batch_size"]).max()
    out = {"max_doc_count_error_per_step": float(doc_err), "seconds": round(result["seconds"], 1)}
    for name, (a, b) in {"phase1 0-99": (0, 100), "ramp 100-199": (100, 200), "hold 200-249": (200, 250),
                         "phase3 250-": (250, result["steps"])}.items():
        if a >= result["steps"]:
            continue
        tgt = np.asarray(result["target_token_share"][a:b])[:, 1]
        got = tshare[a:b, 1]
        out[name] = {"target_docstring_token_share": round(float(tgt.mean()), 4),
                     "realised": round(float(got.mean()), 4),
                     "per_step_abs_dev": round(float(np.abs(got - tgt).mean()), 4)}
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks --only curricula", description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--out", default="docs/img/curriculum.png")
    ap.add_argument("--json", default=None, help="write the per-step counts and the summary here")
    ap.add_argument("--replot", default=None, help="plot a --json file written earlier instead of running")
    ap.add_argument("--no-plot", action="store_true", help="print the summary only (the entry point's --no-write)")
    args = ap.parse_args(argv)
    if args.replot:
        with open(args.replot) as f:
            result = json.load(f)
    else:
        result = run(args.steps)
    if not args.no_plot:
        plot(result, args.out)
    s = summary(result)
    print(json.dumps(s, indent=1))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({**result, "summary": s}, f)
    if not args.no_plot:
        print(f"wrote {args.out}", file=sys.stderr)
    return 0

