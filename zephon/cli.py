"""The ``zephon`` command: ``demo`` (the embedded default), ``verify`` (elastic determinism on your
data) and ``inspect`` (what a path holds)."""
from __future__ import annotations

import argparse
import json
import sys
import time

from tqdm import tqdm


def _build_pipeline(args, tokenizer_path):
    from .formats import open_dataset
    from .ops import Batch, Decode, EnsureMixture, Pack, Shuffle, Tokenize, token_corrected_weights

    datasets = [open_dataset(p, format=args.format, columns=[args.field], on_error=args.on_error)
                for p in args.data]
    weights = _numbers(args.weights, float, "--weights") if args.weights else [1.0] * len(datasets)
    if len(weights) != len(datasets):
        raise ValueError(f"{len(weights)} --weights for {len(datasets)} --data paths")
    tok = Tokenize(tokenizer_path, field=args.field, eos_id=args.eos_token, max_length=args.max_length)
    decode = Decode(args.field)
    ops = [decode, tok]
    if args.ensure_mixture and len(datasets) > 1:
        # sample weights from measured document lengths, so token shares (not sample shares) hit the target
        ops.append(EnsureMixture(weights))
        weights = token_corrected_weights(
            datasets, weights, lambda recs: [r["num_tokens"] for r in tok.process_many(decode.process_many(recs))],
            seed=args.seed)
    ops.append(Pack(args.max_length, method=args.pack_method))
    if args.shuffle_buffer:
        ops.append(Shuffle(args.shuffle_buffer, seed=args.seed))

    def make_loader(dp, rank, micro_batch, runner):
        from .engine import Loader
        return Loader(datasets, ops + [Batch(micro_batch)], weights=weights, seed=args.seed,
                      canonical_replicas=args.canonical_replicas, chunk_size=args.chunk_size,
                      global_batch_size=args.global_batch_size or args.canonical_replicas * args.micro_batch,
                      flush_every_k_chunks=args.flush_every_k_chunks, dp_degree=dp, dp_rank=rank, runner=runner,
                      num_workers=args.workers)
    return datasets, make_loader


def _numbers(text: str, kind, flag: str) -> list:
    try:
        return [kind(x) for x in text.split(",")]
    except ValueError:
        raise ValueError(f"{flag} takes comma-separated numbers, got {text!r}") from None


def _print_verify(report, args, rows=None) -> int:
    from .verify import format_table

    print(format_table(report, rows))
    ref = report["reference"]
    print(f"\ncheckpoint at step {args.checkpoint_step} on dp={args.dp}: {report['checkpoint_bytes']:,} bytes of JSON "
          f"for {args.canonical_replicas} lanes")
    for ph in report["resumes"]:
        cold = ph.cold.first_batch_s
        print(f"  {ph.name:<14} runner={ph.runner:<9} workers={ph.workers} micro_batch={ph.micro_batch}: "
              f"first global batch after restore {ph.first_batch_s:.2f}s, cold start on the same dp "
              f"{cold:.2f}s (x{ph.first_batch_s / max(cold, 1e-9):.2f})")
    if report["mismatches"]:
        for name, step in report["mismatches"]:
            print(f"MISMATCH: {name} first differs from the reference at step {step}", file=sys.stderr)
        return 1
    n = len(ref.digests)
    print(f"OK: all {n} steps' global-batch SHA-256 equal the uninterrupted dp=1 reference "
          f"(checkpointed run and resumes on dp {', '.join(str(p.dp) for p in report['resumes'])})")
    return 0


def _run_verify(args, tokenizer_path) -> int:
    import os

    from .verify import elastic_verify
    from .work import check_topology

    resume = _numbers(args.resume_dp, int, "--resume-dp")
    for dp in [args.dp, *resume]:  # before any work: a bad topology should not cost a run
        check_topology(args.canonical_replicas, dp)
    if args.output_json and not os.path.isdir(os.path.dirname(os.path.abspath(args.output_json))):
        raise ValueError(f"--output-json: directory of {args.output_json} does not exist")
    _, make_loader = _build_pipeline(args, tokenizer_path)
    total = args.steps + args.checkpoint_step + len(resume) * (args.steps - args.checkpoint_step)
    with tqdm(total=total, desc="verify (global steps)", unit="step", file=sys.stderr,
              disable=args.no_progress) as bar:
        report = elastic_verify(make_loader, dp=args.dp, resume_dps=resume, checkpoint_step=args.checkpoint_step,
                                steps=args.steps, runner=args.runner, workers=args.workers,
                                micro_batch=args.micro_batch, resume_runner=args.resume_runner,
                                resume_workers=args.resume_workers, resume_micro_batch=args.resume_micro_batch,
                                progress=bar)
    if args.output_json:
        with open(args.output_json, "w") as fh:
            json.dump({"reference": report["reference"].digests,
                       "runs": {p.name: p.digests for p in [report["checkpointed"], *report["resumes"]]},
                       "checkpoint": report["checkpoint"], "mismatches": report["mismatches"]}, fh, indent=1)
    rows = None
    if args.table_rows:
        lo = max(0, args.checkpoint_step - args.table_rows)
        rows = list(range(lo, min(args.steps, args.checkpoint_step + args.table_rows)))
    return _print_verify(report, args, rows)


def _throughput(make_loader, seconds: float, workers: int, runner: str) -> None:
    from .engine import make_runner

    template = make_loader(1, 0, 1, "inline")
    r = make_runner(runner, template.stage, workers)
    L = make_loader(1, 0, 1, r)
    tokens = rows = 0
    it = iter(L)
    next(it)  # start-up (index open, worker spawn) is not throughput
    t0 = time.perf_counter()
    with tqdm(desc=f"throughput ({runner}, {workers} workers)", unit="tok", unit_scale=True, file=sys.stderr) as bar:
        while time.perf_counter() - t0 < seconds:
            mb = next(it)
            n = int(mb["attention_mask"].sum())
            tokens += n
            rows += len(mb["attention_mask"])
            bar.update(n)
    dt = time.perf_counter() - t0
    it.close()
    r.close()
    print(f"tokenize + pack({mb['input_ids'].shape[1]}) + shuffle + batch, runner={runner}: "
          f"{tokens / dt:,.0f} tokens/s ({rows} rows, {tokens:,} tokens in {dt:.1f}s, "
          f"padding {1 - tokens / (rows * mb['input_ids'].shape[1]):.1%})")


def cmd_demo(args) -> int:
    from .demo_corpus import build_corpus, build_tokenizer, default_workdir

    workdir = args.workdir or default_workdir()
    print(f"Building the embedded corpus (Python standard library sources and docstrings) in {workdir}")
    corpus = build_corpus(workdir)
    tok = build_tokenizer(workdir, [corpus["source_jsonl"], corpus["docstrings_jsonl"]])
    args.data = [corpus["source_jsonl"], corpus["docstrings_jsonl"]]
    datasets, make_loader = _build_pipeline(args, tok)
    for d in datasets:
        print(f"  dataset {d.name}: {len(d.shards)} JSONL shards, {d.num_samples:,} documents")
    print(f"  tokenizer: byte-level BPE trained locally, {tok}")
    _throughput(make_loader, args.seconds, args.workers, args.runner)
    print(f"\nElastic resume: {args.canonical_replicas} lanes, checkpoint at step {args.checkpoint_step} on "
          f"dp={args.dp}, resumed on dp={args.resume_dp} (global batch {args.canonical_replicas * args.micro_batch} "
          f"rows of {args.max_length} tokens)")
    return _run_verify(args, tok)


def cmd_verify(args) -> int:
    from .demo_corpus import build_corpus, build_tokenizer, default_workdir

    tok = args.tokenizer
    if tok is None:
        workdir = default_workdir()
        corpus = build_corpus(workdir)
        tok = build_tokenizer(workdir, [corpus["source_jsonl"], corpus["docstrings_jsonl"]])
        print(f"(no --tokenizer: using the demo tokenizer {tok})", file=sys.stderr)
    return _run_verify(args, tok)


def cmd_inspect(args) -> int:
    from .formats import inspect_source

    info = inspect_source(args.path, format=args.format)
    if args.json:
        print(json.dumps(info, indent=1))
        return 0
    n = info["num_shards"]
    print(f"{args.path}: format {info['format']}, {n} shard{'s' * (n != 1)}, {info['num_samples']:,} samples")
    print(f"columns: {', '.join(info['columns'])}")
    for s in info["shards"]:
        cols = f"  columns: {', '.join(s['columns'])}" if s.get("columns") not in (None, info["columns"]) else ""
        print(f"  {s['path']}  {s['format']}  {s['num_samples']:,} samples  {s['size_bytes']:,} bytes{cols}")
    return 0


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def _pipeline_args(p, demo: bool) -> None:
    p.add_argument("--canonical-replicas", type=int, default=64, help="lanes (fixed for a run)")
    p.add_argument("--dp", type=int, default=16, help="dp degree of the checkpointed run")
    p.add_argument("--resume-dp", default="8,32,64", help="comma-separated dp degrees to resume on")
    p.add_argument("--checkpoint-step", type=int, default=20 if demo else 150)
    p.add_argument("--steps", type=int, default=40 if demo else 300)
    p.add_argument("--max-length", type=int, default=2048, help="tokens per packed row")
    p.add_argument("--micro-batch", type=_positive, default=1, help="rows per micro-batch")
    p.add_argument("--global-batch-size", type=int, default=None,
                   help="rows per global step (default canonical_replicas x micro-batch)")
    p.add_argument("--runner", default="threads", choices=["inline", "threads", "processes"])
    p.add_argument("--workers", type=_positive, default=2)
    p.add_argument("--resume-runner", default=None, choices=["inline", "threads", "processes"])
    p.add_argument("--resume-workers", type=_positive, default=None)
    p.add_argument("--resume-micro-batch", type=_positive, default=None,
                   help="micro-batch size after the resume (gradient accumulation keeps the global batch)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--chunk-size", type=int, default=256, help="pointers per chunk")
    p.add_argument("--flush-every-k-chunks", type=float, default=None,
                   help="chunks between flush sentinels (a fraction allowed; default: every min(chunk_size, 256) "
                        "pointers)")
    p.add_argument("--shuffle-buffer", type=int, default=32, help="rows in the shuffle buffer (0 = off)")
    p.add_argument("--pack-method", default="best_fit", choices=["best_fit", "first_fit"])
    p.add_argument("--ensure-mixture", action="store_true",
                   help="weights are token shares: correct sample weights by mean document length and "
                        "reorder documents by token deficit")
    p.add_argument("--field", default="text", help="text field / column")
    p.add_argument("--format", default=None, choices=["jsonl", "parquet", "mds", "energon"],
                   help="default: by file extension (MDS: a folder with index.json; energon: with .nv-meta)")
    p.add_argument("--eos-token", default="<eos>")
    p.add_argument("--on-error", default="raise", choices=["raise", "skip"],
                   help="bad samples: raise (default) or skip, count and report them")
    p.add_argument("--output-json", default=None, help="write every step's digests and the checkpoint here")
    p.add_argument("--table-rows", type=_positive, default=None,
                   help="show only this many steps either side of the checkpoint")
    p.add_argument("--no-progress", action="store_true")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="zephon", description=__doc__)
    sub = parser.add_subparsers(dest="cmd", required=True)
    demo = sub.add_parser("demo", help="the embedded default: stdlib corpus, throughput, elastic resume table")
    demo.add_argument("--workdir", default=None, help="where the corpus and tokenizer are cached")
    demo.add_argument("--seconds", type=float, default=10.0, help="duration of the throughput run")
    demo.add_argument("--weights", default="0.7,0.3", help="mixture of stdlib sources and docstrings")
    _pipeline_args(demo, demo=True)
    verify = sub.add_parser("verify", help="check elastic determinism on your data")
    verify.add_argument("--data", action="append", required=True, help="dataset path (dir, glob, file); repeat")
    verify.add_argument("--weights", default=None, help="comma-separated mixture weights, one per --data")
    verify.add_argument("--tokenizer", default=None, help="tokenizer.json (default: the demo's stdlib BPE)")
    _pipeline_args(verify, demo=False)
    insp = sub.add_parser("inspect", help="formats, shards, sample counts, columns")
    insp.add_argument("path")
    insp.add_argument("--format", default=None, choices=["jsonl", "parquet", "mds", "energon"],
                   help="default: by file extension (MDS: a folder with index.json; energon: with .nv-meta)")
    insp.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    if args.cmd in ("demo", "verify") and not 0 < args.checkpoint_step < args.steps:
        parser.error(f"need 0 < --checkpoint-step ({args.checkpoint_step}) < --steps ({args.steps})")
    from .engine import CheckpointError
    from .formats import DataError
    from .work import TopologyError
    try:
        return {"demo": cmd_demo, "verify": cmd_verify, "inspect": cmd_inspect}[args.cmd](args)
    except (DataError, CheckpointError, TopologyError, ValueError, OSError) as e:
        # bad input or arguments: one clear line, no traceback (ValueError covers bad sizes and options)
        print(f"zephon: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
