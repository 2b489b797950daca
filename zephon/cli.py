"""The ``zephon`` command: ``demo`` (the embedded default), ``verify`` (elastic determinism on your
data), ``inspect`` (what a path holds), ``explain`` and ``diff`` (``cli_debug``: what a step holds, what a config
change moves)."""
from __future__ import annotations

import argparse
import json
import sys
import time

from tqdm import tqdm

from .cli_formats import numbers as _numbers, positive as _positive


from .cli_pipeline import build_pipeline


def _print_verify(report, args, rows=None) -> int:
    from .verify import format_table

    print(format_table(report, rows))
    print(f"\ncheckpoint at step {args.checkpoint_step} on dp={args.dp}: {report['checkpoint_bytes']:,} bytes of JSON "
          f"for {args.canonical_replicas} lanes merged; per rank, at most {report['rank_entry_bytes']:,} bytes (its "
          f"own lanes)")
    for ph in report["resumes"]:
        cold = ph.cold.first_batch_s
        print(f"  {ph.name:<14} runner={ph.runner:<9} workers={ph.workers} micro_batch={ph.micro_batch}: "
              f"first global batch after restore {ph.first_batch_s:.2f}s, cold start on the same dp "
              f"{cold:.2f}s (x{ph.first_batch_s / max(cold, 1e-9):.2f}); each rank read at most "
              f"{ph.entries_read} of the {args.dp} rank entries ({ph.bytes_read:,} bytes)")
    if report.get("metrics"):
        from .host.metrics import format_metrics
        print(f"\nreference run (dp=1), {format_metrics(report['metrics'])}")
    if report["mismatches"]:
        for name, step in report["mismatches"]:
            print(f"MISMATCH: {name} first differs from the reference at step {step}", file=sys.stderr)
        return 1
    n = args.steps  # the reference may run further (a skip): count the steps verified
    print(f"OK: all {n} steps' global-batch SHA-256 equal the uninterrupted dp=1 reference "
          f"(checkpointed run and resumes on dp {', '.join(str(p.dp) for p in report['resumes'])})")
    return 0


def _run_verify(args, tokenizer_path) -> int:
    import os

    from .cli_debug import verify_skip
    from .verify import elastic_verify
    from .work import TopologyError, check_share_rows, check_topology

    resume = _numbers(args.resume_dp, int, "--resume-dp")
    R = args.canonical_replicas
    gbs = args.global_batch_size or R * args.micro_batch
    runs = [("--dp", args.dp, args.micro_batch, "--micro-batch")] + [
        ("--resume-dp", dp, args.resume_micro_batch or args.micro_batch, "--resume-micro-batch") for dp in resume]
    for flag, dp, m, m_flag in runs:  # before any work: a bad topology should not cost a run
        try:
            check_topology(R, dp)
            if dp > R and gbs % R == 0:  # ranks share lanes: each takes whole micro-batches of a lane's step
                check_share_rows(gbs // R, m, dp // R)
        except TopologyError as e:
            raise TopologyError(f"{flag} {dp} ({m_flag} {m}; --dp defaults to 16 and --resume-dp to 8,32,64) with "
                                f"--canonical-replicas {R}: {e}") from None
    if args.output_json and not os.path.isdir(os.path.dirname(os.path.abspath(args.output_json))):
        raise ValueError(f"--output-json: directory of {args.output_json} does not exist")
    skip = verify_skip(args)
    _, make_loader = build_pipeline(args, tokenizer_path)
    total = args.steps + args.checkpoint_step + len(resume) * (args.steps - args.checkpoint_step)
    with tqdm(total=total, desc="verify (global steps)", unit="step", file=sys.stderr,
              disable=args.no_progress) as bar:
        report = elastic_verify(make_loader, dp=args.dp, resume_dps=resume, checkpoint_step=args.checkpoint_step,
                                steps=args.steps, runner=args.runner, workers=args.workers,
                                micro_batch=args.micro_batch, resume_runner=args.resume_runner,
                                resume_workers=args.resume_workers, resume_micro_batch=args.resume_micro_batch,
                                progress=bar, skip=skip)
    if args.output_json:
        with open(args.output_json, "w") as fh:
            json.dump({"reference": report["reference"].digests,
                       "runs": {p.name: p.digests for p in [report["checkpointed"], *report["resumes"]]},
                       "checkpoint": report["checkpoint"], "mismatches": report["mismatches"],
                       "metrics": report["metrics"]}, fh, indent=1)
    rows = None
    if args.table_rows:
        lo = max(0, args.checkpoint_step - args.table_rows)
        rows = list(range(lo, min(args.steps, args.checkpoint_step + args.table_rows)))
    return _print_verify(report, args, rows)


def _throughput(make_loader, seconds: float, workers: int, runner: str) -> None:
    from .engine import make_runner

    stage = make_loader(1, 0, 1, "inline").plan.stage  # what the shared runner's workers run
    r = make_runner(runner, stage, workers)
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
    datasets, make_loader = build_pipeline(args, tok)
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
    """List shards, counts and columns, checking every shard against its index (``formats.check``); with
    ``--deep`` read every sample. Exit 1 when a shard is bad, naming each with what was expected and found; else
    3 when a shard could not be checked (the store did not answer: not bad data, named with its URL and error)."""
    from .cli_formats import open_keywords, unopenable
    from .formats import DamagedIndexError, DataError, open_dataset
    from .formats.check import check_shard, summary
    from .formats.remote import CacheFull

    _, kw = open_keywords(args, args.path)
    try:
        ds = open_dataset(args.path, **kw)
    except DataError as e:  # the data is bad (1), not an argument (2): name every file that does not open
        bad = [str(e)] if isinstance(e, DamagedIndexError) else unopenable(args.path, kw, e)
        if bad is None:
            raise
        for line in bad:
            print(f"zephon inspect: {line}", file=sys.stderr)
        verb = "does" if len(bad) == 1 else "do"
        print(f"zephon inspect: {len(bad)} of the dataset's files {verb} not open", file=sys.stderr)
        return 1
    total = ds.num_samples if args.deep else len(ds.shards)
    with tqdm(total=total, desc="inspect --deep (samples)" if args.deep else "inspect (shards)", file=sys.stderr,
              disable=args.no_progress or args.json, unit="sample" if args.deep else "shard") as bar:
        reports = []
        for i in range(len(ds.shards)):
            try:
                reports.append(check_shard(ds, i, deep=args.deep, progress=bar.update if args.deep else None,
                                           field=args.field))
            except CacheFull as e:  # raised before the download: a setting to change, the same for every shard
                bar.close()
                args.inspect_parser.error(f"--cache-limit {args.cache_limit}: {e}; give at least the size of the "
                                  f"largest shard")
            if not args.deep:
                bar.update(1)
    info = summary(ds, reports, args.deep)
    if args.json:
        print(json.dumps(info, indent=1))
    else:
        _print_inspect(args.path, info)
    bad, unreachable = info["bad_shards"], info["unreachable_shards"]
    if unreachable:
        print(f"zephon inspect: {len(unreachable)} of {info['num_shards']} shards could not be checked (unreachable: "
              f"a network or store failure, not bad data):", file=sys.stderr)
        for line in unreachable:
            print(f"  {line}", file=sys.stderr)
    if bad:
        print(f"zephon inspect: {len(bad)} of {info['num_shards']} shards bad: {', '.join(bad)}", file=sys.stderr)
        return 1
    return 3 if unreachable else 0


def _print_inspect(path: str, info: dict) -> None:
    n = info["num_shards"]
    print(f"{path}: format {info['format']}, {n} shard{'s' * (n != 1)}, {info['num_samples']:,} samples")
    print(f"columns: {', '.join(info['columns'])}")
    for s in info["shards"]:
        cols = f"  columns: {', '.join(s['columns'])}" if s["columns"] and s["columns"] != info["columns"] else ""
        state = "OK" if s["ok"] else "UNREACHABLE" if s["unreachable"] else "BAD"
        print(f"  {s['path']}  {s['format']}  {s['num_samples']:,} samples  {s['size_bytes']:,} bytes{cols}  {state}")
        if s["unreachable"]:
            print(f"      not checked: {s['unreachable']}")
        for problem in s["problems"]:
            print(f"      {problem}")
        if s["bad_samples"]:
            print(f"      {s['bad_samples']:,} of {s['samples_read']:,} samples do not read; first bad sample "
                  f"{s['first_bad_sample']}: {s['first_bad_error']}")
    what = "every sample read" if info["deep"] else "sizes, headers and indexes; --deep reads every sample"
    result = [f"{len(info['bad_shards'])} bad"] * bool(info["bad_shards"]) + \
        [f"{len(info['unreachable_shards'])} unreachable"] * bool(info["unreachable_shards"])
    print(f"checked {n} shard{'s' * (n != 1)} ({what}): " + (", ".join(result) or "all OK"))


FIELD_HELP = "text field / column (Energon: a field_map field such as text, or a part such as txt)"


def _pipeline_args(p, demo: bool, debug: bool = False) -> None:
    p.add_argument("--canonical-replicas", type=int, default=64, help="lanes (fixed for a run)")
    dp_help = "dp degree whose ranks explain names" if debug else "dp degree of the checkpointed run"
    p.add_argument("--dp", type=int, default=1 if debug else 16, help=f"{dp_help} (default {1 if debug else 16})")
    if not debug:  # explain / diff replay from a checkpoint: no run to take, resume or tabulate
        p.add_argument("--resume-dp", default="8,32,64",
                       help="comma-separated dp degrees to resume on (default 8,32,64)")
        p.add_argument("--checkpoint-step", type=int, default=20 if demo else 150)
        p.add_argument("--steps", type=int, default=40 if demo else 300)
    p.add_argument("--max-length", type=int, default=2048, help="tokens per packed row")
    p.add_argument("--micro-batch", type=_positive, default=1, help="rows per micro-batch")
    p.add_argument("--global-batch-size", type=int, default=None,
                   help="rows per global step (default canonical_replicas x micro-batch)")
    p.add_argument("--workers", type=_positive, default=2)
    if not debug:
        p.add_argument("--runner", default="threads", choices=["inline", "threads", "processes"])
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
    p.add_argument("--pack-method", default="best_fit", choices=["best_fit", "first_fit", "concat"],
                   help="best_fit / first_fit: documents in bins, padded; concat: documents end to end cut into "
                        "--max-length windows (no padding, documents split across rows)")
    p.add_argument("--ensure-mixture", action="store_true",
                   help="weights are token shares: correct sample weights by mean document length and "
                        "reorder documents by token deficit")
    p.add_argument("--field", default="text", help=FIELD_HELP)
    p.add_argument("--eos-token", default="<eos>",
                   help="token (or integer id) appended to each document; must be in the tokenizer's vocabulary "
                        "(e.g. </s>, <|endoftext|>); the default <eos> is the demo tokenizer's")
    p.add_argument("--on-error", default="raise", choices=["raise", "skip"],
                   help="bad samples: raise (default) or skip, count and report them")
    if not debug:
        p.add_argument("--output-json", default=None,
                       help="write every step's digests, the checkpoint and the reference run's metrics here")
        p.add_argument("--table-rows", type=_positive, default=None,
                       help="show only this many steps either side of the checkpoint")
    p.add_argument("--no-progress", action="store_true")


def main_parser() -> argparse.ArgumentParser:
    """The ``zephon`` command's argument parser (every subcommand)."""
    from . import cli_debug
    from .cli_formats import add_format_args

    parser = argparse.ArgumentParser(prog="zephon", description=__doc__)
    sub = parser.add_subparsers(dest="cmd", required=True)
    demo = sub.add_parser("demo", help="the embedded default: stdlib corpus, throughput, elastic resume table")
    demo.add_argument("--workdir", default=None, help="where the corpus and tokenizer are built and cached (default: "
                                                       "$ZEPHON_DEMO_DIR, else $ZEPHON_CACHE_DIR/demo, else "
                                                       "~/.cache/zephon/demo)")
    demo.add_argument("--seconds", type=float, default=10.0, help="duration of the throughput run")
    demo.add_argument("--weights", default="0.7,0.3", help="mixture of stdlib sources and docstrings")
    _pipeline_args(demo, demo=True)
    verify = sub.add_parser("verify", help="check elastic determinism on your data")
    verify.add_argument("--data", action="append", required=True, help="dataset path (dir, glob, file); repeat")
    verify.add_argument("--weights", default=None, help="comma-separated mixture weights, one per --data")
    verify.add_argument("--schedule", default=None, help="YAML/JSON mixture schedule, one weight spec per --data "
                        "(number, {step: {step: w}} or {linear: {step: w}}); see docs/curricula.md")
    verify.add_argument("--tokenizer", default=None, help="tokenizer.json (default: the demo's stdlib BPE)")
    verify.add_argument("--skip", default=None, help="A:B: the resumes skip steps A..B-1 (docs/debugging.md)")
    _pipeline_args(verify, demo=False)
    add_format_args(verify)
    insp = sub.add_parser("inspect", help="formats, shards, sample counts, columns; checks every shard against "
                                          "its index (exit 1 naming each bad shard; 3 when none is bad but a "
                                          "shard in a bucket could not be read)")
    insp.add_argument("path", help="dataset path: directory, glob, file, MDS or Energon root, or s3:// URL")
    insp.add_argument("--deep", action="store_true", help="also read (decode) every sample; name the first bad "
                                                          "sample of each shard")
    insp.add_argument("--field", default="text", help=FIELD_HELP + "; --deep checks every sample holds it as text")
    insp.add_argument("--json", action="store_true")
    insp.add_argument("--no-progress", action="store_true")
    insp.set_defaults(inspect_parser=insp)  # a usage error found after parsing (--cache-limit) shows this usage
    add_format_args(insp)
    cli_debug.add_parsers(sub, _pipeline_args, add_format_args)
    return parser


def main(argv=None) -> int:
    from . import cli_debug
    parser = main_parser()
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parser.parse_args(argv)
    args.argv, args.parser = argv, parser  # diff re-parses its --against flags with this parser
    if args.cmd in ("demo", "verify") and not 0 < args.checkpoint_step < args.steps:
        parser.error(f"need 0 < --checkpoint-step ({args.checkpoint_step}) < --steps ({args.steps}): verify checks "
                     f"a resume from mid-run (a step-0 checkpoint, Loader.checkpoint() before the first batch, "
                     f"restores through the API)")
    from .checkpoint import CheckpointError
    from .formats import DataError, remote
    from .work import TopologyError
    try:
        return {"demo": cmd_demo, "verify": cmd_verify, "inspect": cmd_inspect, "explain": cli_debug.run,
                "diff": cli_debug.run}[args.cmd](args)
    except (DataError, CheckpointError, TopologyError, ValueError, OSError, remote.RemoteError) as e:
        # bad input or arguments: one clear line, no traceback (ValueError covers bad sizes and options)
        print(f"zephon: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
