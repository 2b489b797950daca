"""Throughput of tokenize + best-fit pack + batch, per runner, next to a raw tokenizer baseline.

    python -m benchmarks --only throughput [--workdir DIR] [--repeats 3] [--quick] [--runners inline,threads,processes]
                                           [--workers 2] [--canonical-replicas 8] [--format jsonl|parquet]

What is measured (one pass over the demo corpus per repetition, every document exactly once):

* ``raw``: the documents' texts already in memory; ``tokenizer.encode_batch_fast`` over them in
  batches of ``--unit-size`` documents, EOS appended to each, all ids concatenated into one int32
  stream (numpy) and split into ``--seq-len`` rows (the last row zero-padded). The reference.
* ``raw+read``: the same, plus reading and decoding the shard files sequentially (json.loads per line
  or pyarrow ``to_pylist``) inside the timing. For context only: it shows what the I/O costs.
* ``zephon/<runner>``: ``Loader([source, docstrings], [Decode(), Tokenize(eos, max_length=seq_len),
  Pack(seq_len, "best_fit"), (Shuffle(n)), Batch(micro_batch_size, drop_last=False)])`` with
  ``exhaustion="stop"`` and mixture weights proportional to the dataset sizes, so one pass delivers
  every document once. Reading files is inside the timing (it is part of the loader's job).

"Tokens" are real, non-padding tokens delivered: ``attention_mask.sum()`` for zephon, the length of
the id stream for raw. Both must be equal (checked and printed). tokens/s = tokens / wall seconds of
the pass; ratio = median zephon tokens/s / median raw tokens/s; the per-round ratios compare with
the raw run of the same round and show how noisy the machine was. CPU s = user + system seconds of
the pass over the process's threads and its worker processes, and in brackets CPU s / wall s (how
many cores the configuration kept busy: on a 2-core machine, near 1.0 means it ran on one core or
other processes took the other); tokens/CPU-s is less sensitive than tokens/s to such competition.

Each (configuration, repetition) runs in a fresh subprocess, so peak RSS is isolated per configuration,
and repetitions are interleaved (round r runs every configuration, in an order rotated by r) so the
drift of a shared, noisy machine hits every configuration alike. Inside a subprocess: build the
runner (worker threads or spawned processes) and do one untimed warm-up pass (``startup``: runner
creation up to the warm-up's first micro-batch, so it includes process spawn); then the timed pass,
with a new Loader on the same, already running runner, timed from the first batch request to
exhaustion (``1st batch``: latency of its first micro-batch). Peak RSS: VmHWM of the subprocess and
of its largest worker process. A SHA-256 of the delivered micro-batches (hashing time excluded)
checks that every runner delivered the same bytes.

Prints only; asserts nothing about speed.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import subprocess
import sys
from pathlib import Path

from benchmarks.common import REPO, RESULT_TAG, cpu_model

from .measure import all_pointers, corpus_paths, open_datasets, run_child

DEFAULT_RUNNERS = "inline,threads,processes,threads+concat,torch"


# --------------------------------------------------------------------------------- orchestration

def split_config(cfg: str) -> tuple[str, str, int | None]:
    """``[before:]RUNNER[+concat][@LANES]`` -> (``before`` or ``""``, the child's configuration, lanes or None)."""
    body, _, lanes = cfg.removeprefix("before:").partition("@")
    return ("before" if cfg.startswith("before:") else ""), body, int(lanes) if lanes else None


def child_argv(args, cfg: str) -> list[str]:
    _, body, lanes = split_config(cfg)  # lanes as the option, so an older checkout's child understands it too
    argv = [sys.executable, "-m", "benchmarks", "--only", "throughput", "--child", body, "--workdir", args.workdir,
            "--workers", str(args.workers), "--canonical-replicas", str(lanes or args.canonical_replicas),
            "--format", args.format, "--seq-len", str(args.seq_len), "--chunk-size", str(args.chunk_size),
            "--unit-size", str(args.unit_size), "--micro-batch-size", str(args.micro_batch_size),
            "--shuffle-buffer", str(args.shuffle_buffer), "--seed", str(args.seed),
            "--vocab-size", str(args.vocab_size)]
    if args.quick:
        argv.append("--quick")
    return argv


def run_config(args, cfg: str) -> dict | None:
    """One child run of ``cfg``; a ``before:`` configuration runs on the ``--before`` checkout (its zephon and its
    benchmark child), in the same round as the others."""
    root = args.before if split_config(cfg)[0] else str(REPO)
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH")) if p)
    proc = subprocess.run(child_argv(args, cfg), cwd=root, env=env, capture_output=True, text=True)
    for line in proc.stdout.splitlines():
        if line.startswith(RESULT_TAG):
            return json.loads(line[len(RESULT_TAG):])
    sys.stderr.write(f"[{cfg}] failed (exit {proc.returncode}):\n{proc.stderr[-4000:]}\n")
    return None


def code_version() -> str:
    """``git describe``-like identity of the code measured: commit, plus a note when zephon/ has local changes."""
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=str(REPO), capture_output=True,
                              text=True, timeout=10).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--", "zephon"], cwd=str(REPO), capture_output=True,
                               text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return (head or "unknown") + (" + uncommitted changes in zephon/" if dirty else "")


def fmt_rate(x: float) -> str:
    return f"{x / 1e6:.2f}M"


def fmt_opt(x, spec: str) -> str:
    return "-" if x is None else format(x, spec)


def config_name(cfg: str) -> str:
    """A zephon configuration's row name: ``zephon/RUNNER[+concat][@LANES]``, `` (before)`` for the old checkout."""
    before, body, lanes = split_config(cfg)
    return f"zephon/{body}" + (f", {lanes} lanes" if lanes else "") + (" (before)" if before else "")


def summarize(results: dict, configs: list[str]) -> list[str]:
    """Markdown table, one row per configuration. ratio: median tokens/s over raw's median tokens/s;
    per-round ratios: against the raw run of the same round (shows the noise)."""
    med = {}
    for cfg in configs:
        rs = [r for r in results[cfg] if r]
        if rs:
            med[cfg] = statistics.median(r["tokens"] / r["seconds"] for r in rs)
    base, torch_med = med.get("raw"), med.get("torch")
    cols = ["configuration", "tokens/s median (min-max)", "ratio vs raw", "per-round ratios", "vs torch",
            "per-round vs torch", "pass s",
            "CPU s (cores busy)", "tokens/CPU-s", "startup s", "1st batch s", "rows", "peak RSS MiB main / worker",
            "reps"]
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for cfg in configs:
        runs = results[cfg]
        rs = [r for r in runs if r]
        name = cfg if cfg.startswith("raw") else "torch DataLoader" if cfg == "torch" else config_name(cfg)
        if not rs:
            lines.append(f"| {name} | failed |" + " |" * (len(cols) - 3) + f" 0/{len(runs)} |")
            continue
        rates = [r["tokens"] / r["seconds"] for r in rs]
        per_round, per_torch = [], []
        for r, b, t in zip(runs, results.get("raw", [None] * len(runs)), results.get("torch", [None] * len(runs))):
            for ref, out in ((b, per_round), (t, per_torch)):
                if r and ref:
                    out.append(f"{(r['tokens'] / r['seconds']) / (ref['tokens'] / ref['seconds']):.2f}")
        cpu = statistics.median(r["cpu"] for r in rs)
        startup = [r["startup"] for r in rs if r.get("startup") is not None]
        first = [r["first_batch"] for r in rs if r.get("first_batch") is not None]
        wrss = [r["rss_worker_mib"] for r in rs if r.get("rss_worker_mib") is not None]
        cells = [
            name,
            f"{fmt_rate(med[cfg])} ({fmt_rate(min(rates))}-{fmt_rate(max(rates))})",
            f"{med[cfg] / base:.2f}" if base else "-",
            " ".join(per_round) or "-",
            f"{med[cfg] / torch_med:.2f}" if torch_med else "-",
            " ".join(per_torch) or "-",
            f"{statistics.median(r['seconds'] for r in rs):.2f}",
            f"{cpu:.2f} ({statistics.median(r['cpu'] / r['seconds'] for r in rs):.1f})",
            fmt_rate(statistics.median(r["tokens"] / r["cpu"] for r in rs if r["cpu"] > 0)),
            fmt_opt(statistics.median(startup) if startup else None, ".2f"),
            fmt_opt(statistics.median(first) if first else None, ".2f"),
            str(rs[0]["rows"]),
            f"{max(r['rss_main_mib'] for r in rs):.0f} / " + (f"{max(wrss):.0f}" if wrss else "-"),
            f"{len(rs)}/{len(runs)}",
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def stage_table(results: dict, configs: list[str]) -> list[str]:
    """Markdown table: ``Loader.metrics()["stage_s"]`` of the timed pass (medians over the repetitions; worker stages
    summed over workers) beside its wall seconds."""
    stages = sorted({k for c in configs for r in results[c] if r for k in r.get("stage_s", {})},
                    key=lambda k: ("read", "decode", "tokenize").index(k) if k in ("read", "decode", "tokenize")
                    else 9)
    lines = ["| configuration | pass s | " + " | ".join(f"{k} s" for k in stages) + " |",
             "|" + "---|" * (len(stages) + 2)]
    for c in configs:
        rs = [r for r in results[c] if r and r.get("stage_s")]
        if rs:
            cells = [f"{statistics.median(r['stage_s'].get(k, 0.0) for r in rs):.2f}" for k in stages]
            wall = statistics.median(r["seconds"] for r in rs)
            lines.append(f"| {config_name(c)} | {wall:.2f} | " + " | ".join(cells) + " |")
    return lines


def main(argv=None) -> int:
    from zephon.demo_corpus import default_workdir

    ap = argparse.ArgumentParser(prog="python -m benchmarks --only throughput", description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workdir", default=default_workdir(),
                    help="demo corpus and tokenizer cache (default: %(default)s)")
    ap.add_argument("--repeats", type=int, default=None,
                    help="timed repetitions per configuration (default 3; 1 with --quick)")
    ap.add_argument("--runners", default=DEFAULT_RUNNERS, help="comma-separated zephon runners (default: %(default)s)")
    ap.add_argument("--workers", type=int, default=2, help="num_workers of the threads/processes runners")
    ap.add_argument("--canonical-replicas", type=int, default=8, help="lanes")
    ap.add_argument("--format", choices=("jsonl", "parquet"), default="jsonl")
    ap.add_argument("--quick", action="store_true", help="one shard per dataset (~1/4 of the documents), 1 repetition")
    ap.add_argument("--seq-len", type=int, default=2048, help="pack length / row length")
    ap.add_argument("--chunk-size", type=int, default=1024)
    ap.add_argument("--unit-size", type=int, default=256,
                    help="documents per worker unit; also the raw baseline's encode batch size")
    ap.add_argument("--micro-batch-size", type=int, default=8)
    ap.add_argument("--shuffle-buffer", type=int, default=0, help="add Shuffle(N) after Pack (0 = none)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--vocab-size", type=int, default=8192,
                    help="the corpus BPE's target vocabulary (trained once into the workdir; training stops "
                         "earlier when the corpus has no more merges)")
    ap.add_argument("--no-raw-read", action="store_true", help="skip the raw+read reference row")
    ap.add_argument("--before", metavar="DIR",
                    help="also run every zephon configuration on the checkout in DIR (e.g. `git archive OLD | tar -x "
                         "-C DIR`), in the same rounds: rows marked (before), a fair before/after on a noisy machine")
    ap.add_argument("--child", metavar="CONFIG",
                    help="internal: run one configuration (raw, raw+read or a runner) in this process and print "
                         "its result as JSON; combine with --profile to profile it")
    ap.add_argument("--profile", type=int, default=0, metavar="N",
                    help="with --child RUNNER: cProfile the timed pass, print the top N functions by cumulative "
                         "and by own time to stderr")
    args = ap.parse_args(argv)
    if args.child:
        run_child(args)
        return 0
    repeats = args.repeats or (1 if args.quick else 3)
    runners = [r.strip() for r in args.runners.split(",") if r.strip()]
    from zephon.engine import RUNNERS
    bad = [r for r in runners if r != "torch" and (split_config(r)[1].partition("+")[0] not in RUNNERS
                                                   or split_config(r)[1].partition("+")[2] not in ("", "concat"))]
    if bad:
        ap.error(f"unknown runner(s) {bad}; choose from {RUNNERS}, each optionally +concat and @LANES, or torch")
    if args.before:
        if not (Path(args.before) / "zephon").is_dir():
            ap.error(f"--before {args.before}: no zephon/ there (unpack a commit: git archive COMMIT | tar -x -C DIR)")
        runners += [f"before:{r}" for r in runners if r != "torch"]

    # Build the corpus, tokenizer and JSONL index caches once, before any child (so no child builds them).
    sources, sources_tok = corpus_paths(args)
    from tokenizers import Tokenizer
    vocab = Tokenizer.from_file(sources_tok).get_vocab_size()
    datasets = open_datasets(sources)
    ndocs = sum(ds.num_samples for ds in datasets)
    covered = len(set(all_pointers(args, datasets)))
    configs = ["raw"] + ([] if args.no_raw_read else ["raw+read"]) + runners
    print(f"# zephon throughput: {args.format}, {ndocs} documents ({covered} read in one pass), "
          f"seq_len={args.seq_len}, best_fit, micro_batch={args.micro_batch_size}, "
          f"canonical_replicas={args.canonical_replicas}, workers={args.workers}, unit_size={args.unit_size}, "
          f"chunk_size={args.chunk_size}, shuffle_buffer={args.shuffle_buffer}, repeats={repeats}, "
          f"tokenizer {os.path.basename(sources_tok)} ({vocab} tokens)")
    print(f"# machine: nproc={os.cpu_count()}, cpu={cpu_model()}, python={platform.python_version()}, "
          f"{datetime.datetime.now().astimezone().isoformat(timespec='seconds')}, code {code_version()}"
          + (f", before: {args.before}" if args.before else ""), flush=True)

    load_before = os.getloadavg()[0]
    results = {cfg: [] for cfg in configs}
    for rep in range(repeats):
        for cfg in configs[rep % len(configs):] + configs[:rep % len(configs)]:  # rotate: no fixed neighbours
            res = run_config(args, cfg)
            results[cfg].append(res)
            if res:
                print(f"  round {rep + 1}/{repeats} {cfg:>10}: {res['tokens'] / res['seconds'] / 1e6:6.2f}M tok/s "
                      f"({res['tokens']} tokens, {res['seconds']:.2f} s, {res['cpu']:.2f} CPU s, "
                      f"load {os.getloadavg()[0]:.2f})", flush=True)
    lines = summarize(results, configs)
    print()
    print("\n".join(lines))
    print(f"load average (1 min) before/after the runs: {load_before:.2f} / {os.getloadavg()[0]:.2f} "
          f"on {os.cpu_count()} CPUs (above the CPU count: other processes competed for the cores)")
    tokens = {cfg: {r["tokens"] for r in results[cfg] if r} for cfg in configs}
    ref = tokens.get("raw")
    for cfg in configs:
        if ref and tokens[cfg] and tokens[cfg] != ref:
            print(f"NOTE: {cfg} delivered {sorted(tokens[cfg])} tokens, raw {sorted(ref)}: counts differ")
    if ref and all(tokens[c] == ref for c in configs if tokens[c]):
        print(f"token counts agree: every configuration delivered {next(iter(ref))} real tokens per pass")
    print()
    print("\n".join(stage_table(results, [c for c in runners if c != "torch"])))
    digests = {r["digest"] for cfg in runners if "+" not in cfg and "@" not in cfg and cfg != "torch"
               for r in results[cfg] if r}
    if len(digests) == 1:
        print(f"output digest {next(iter(digests))}: identical bytes from every runner and repetition")
    elif digests:
        print(f"NOTE: runners delivered different bytes: {sorted(digests)} (determinism bug?)")
    return 0

