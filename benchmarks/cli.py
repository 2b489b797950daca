"""``python -m benchmarks``: the one entry point of every benchmark, one section per table.

    python -m benchmarks [--list] [--only NAME[,NAME]] [--quick] [--workdir DIR] [--no-write] [section options]

Without ``--only`` it runs the side-by-side comparisons (pipeline, mds, energon, checkpoints, divergence, lanes;
numbers 1-6 work too) and writes them into docs/benchmarks.md. Options it does not know go to the one section
named by ``--only`` that takes its own (throughput, checkpoint-cost, curricula); e.g.
``python -m benchmarks --only throughput --runners threads --format parquet``. Prints only; asserts nothing.
"""
from __future__ import annotations

import argparse
import importlib
import shlex
import sys
from typing import Callable, NamedTuple


class Section(NamedTuple):
    """One benchmark section: what it prints, and how it runs (``None`` for a side-by-side comparison)."""

    name: str
    number: int | None  # the side-by-side comparison's number, else None
    help: str
    run: Callable | None  # (args, rest) -> exit status; None: a comparison of benchmarks/suite.py
    own_options: bool = False  # takes options of its own (the unknown ones on the command line)


def _simple(module: str) -> Callable:
    """A section whose module has ``main(workdir, quick)`` and no options of its own."""
    def run(args, rest):
        importlib.import_module(f"benchmarks.{module}").main(args.workdir, args.quick)
        return 0
    return run


def _own(module: str, forward: tuple[str, ...]) -> Callable:
    """A section whose module has ``main(argv)``: the unknown options, plus ``forward`` of the entry point's."""
    def run(args, rest):
        argv = list(rest)
        if "workdir" in forward:
            argv += ["--workdir", args.workdir]
        if "quick" in forward and args.quick:
            argv.append("--quick")
        if "repeats" in forward and args.repeats:
            argv += ["--repeats", str(args.repeats)]
        if "write" in forward and (args.no_write or (args.quick and not args.write)):
            argv.append("--no-plot")  # docs/img/ is written only when the entry point would write docs
        return importlib.import_module(f"benchmarks.{module}").main(argv)
    return run


def _loss(args, rest):
    from .loss.run import main

    return main(quick=args.quick, write=not args.no_write and (not args.quick or args.write), results=args.results,
                from_results=args.from_results, workdir=args.workdir)


SECTIONS = [
    Section("pipeline", 1, "side by side: tokenize + pack + batch tokens/s, Zephon vs Grain and torch "
            "(benchmarks/throughput/peers.py)", None),
    Section("mds", 2, "side by side: MDS samples/s, zephon_streaming vs Mosaic Streaming (benchmarks/formats.py)",
            None),
    Section("energon", 3, "side by side: Energon samples/s, zephon_energon vs megatron.energon (benchmarks/formats.py)",
            None),
    Section("checkpoints", 4, "side by side: checkpoint size and restore time at steps 100-10,000 "
            "(benchmarks/checkpoints/peers.py)", None),
    Section("divergence", 5, "side by side: divergence after a resume at another rank count "
            "(benchmarks/divergence.py)", None),
    Section("lanes", 6, "side by side: Zephon throughput against the lane count (benchmarks/throughput/peers.py)",
            None),
    Section("throughput", None, "Zephon runners against a raw tokenizer baseline (benchmarks/throughput/vs_raw.py)",
            _own("throughput.vs_raw", ("workdir", "quick", "repeats")), True),
    Section("stall", None, "data stall of a paced training loop per runner and adapter, at the demo's settings "
            "(benchmarks/stall.py)", _own("stall", ("workdir", "quick", "repeats")), True),
    Section("cores", None, "cores per GPU: tokens per CPU-second of the demo pipeline with a 128k BPE trained here "
            "(benchmarks/cores/)", _own("cores.measure", ("workdir", "quick", "repeats")), True),
    Section("checkpoint-cost", None, "Zephon checkpoint size and resume cost against step and chunk size "
            "(benchmarks/checkpoints/cost.py)", _own("checkpoints.cost", ("workdir", "quick")), True),
    Section("restore", None, "restore against cold start as the shuffle buffer grows "
            "(benchmarks/checkpoints/restore.py)", _simple("checkpoints.restore")),
    Section("packing", None, "padding of Zephon's and Grain's packers (benchmarks/packing.py)", _simple("packing")),
    Section("pass-end", None, "waste at the end of a finite packed pass at 8/16/64 lanes, count split against "
            "size split (benchmarks/pass_end.py)", _simple("pass_end")),
    Section("loss", None, "loss curves across rank counts, Zephon vs four peers (benchmarks/loss/)", _loss),
    Section("remote", None, "remote MDS on S3 (moto), cold and warm cache (benchmarks/remote.py)", _simple("remote")),
    Section("latency", None, "remote MDS and Energon through a 0/30/80 ms latency proxy, beside local disk and "
            "Mosaic Streaming (benchmarks/latency.py)", _simple("latency")),
    Section("freethreaded", None, "runners on free-threaded 3.13t and 3.11, vision-language pipeline "
            "(benchmarks/freethreaded.py)", _simple("freethreaded")),
    Section("transport", None, "worker transport: pickle against shared memory, and inline (benchmarks/transport.py)",
            _simple("transport")),
    Section("ranks", None, "per-rank checkpoints of 64..1,024 simulated ranks restored at half and twice the count: "
            "bytes, entries read, time to first batch, memory per rank (benchmarks/ranks.py)",
            _own("ranks", ("workdir", "quick")), True),
    Section("scale", None, "opening 10^3..10^6 shards and 10^6..10^10 samples (synthetic indexes): memory and time "
            "to first batch per rank (benchmarks/scale.py)", _own("scale", ("quick",)), True),
    Section("first-batch", None, "documents read and seconds to the first global batch at 8/64/512 lanes, cold and "
            "restored (benchmarks/first_batch.py)", _own("first_batch", ("workdir", "quick")), True),
    Section("first-batch-peers", None, "cold seconds to the first batch, Zephon beside Grain, torch, Mosaic Streaming "
            "and Energon (benchmarks/first_batch_peers.py)", _own("first_batch_peers", ("workdir", "quick", "repeats")),
            True),
    Section("curricula", None, "realised dataset shares under a curriculum schedule (benchmarks/curricula.py)",
            _own("curricula", ("write",)), True),
    Section("titan", None, "loss curves through TorchTitan's own Trainer on CPU: checkpoint on 4 ranks, resume on 1 "
            "and 2, from-scratch spread (benchmarks/titan/curves.py; GPUs: scripts/titan_elastic.sh)",
            _own("titan.curves", ("workdir", "quick")), True),
]
BY_NAME = {s.name: s for s in SECTIONS} | {str(s.number): s for s in SECTIONS if s.number}
SIDE_BY_SIDE = ",".join(s.name for s in SECTIONS if s.number)


def parse(argv):
    """The entry point's options and the rest (the section's own options).

    argv: the command line after ``python -m benchmarks``. Raises SystemExit on an unknown section or on section
    options with no section (or several) to take them.
    """
    from zephon.demo_corpus import default_workdir

    ap = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__.split("\n\n")[0])
    ap.add_argument("--list", action="store_true", help="list the sections and exit")
    ap.add_argument("--only", default=SIDE_BY_SIDE, metavar="NAME[,NAME]",
                    help="sections to run (default: the side-by-side comparisons %(default)s); see --list")
    ap.add_argument("--quick", action="store_true", help="each section's smallest settings")
    ap.add_argument("--repeats", type=int, default=None, help="repetitions (default 3; 1 with --quick)")
    ap.add_argument("--workdir", default=default_workdir(), help="corpus + prepared formats (default %(default)s)")
    ap.add_argument("--no-write", action="store_true", help="do not update docs/benchmarks.md and docs/img/")
    ap.add_argument("--write", action="store_true", help="update docs even with --quick")
    ap.add_argument("--results", default=None, help="also save the raw results as JSON here")
    ap.add_argument("--from-results", default=None, metavar="JSON",
                    help="render (print, and write docs unless --no-write) a saved --results file; run nothing")
    args, rest = ap.parse_known_args(argv)
    names = [n.strip() for n in args.only.split(",") if n.strip()]
    unknown = [n for n in names if n not in BY_NAME]
    if unknown:
        ap.error(f"unknown section(s) {unknown}; `python -m benchmarks --list` lists them")
    sections = list(dict.fromkeys(BY_NAME[n] for n in names))
    takers = [s.name for s in sections if s.own_options]
    if rest and len(takers) != 1:
        ap.error(f"options {rest} need exactly one section that takes its own options in --only "
                 f"({', '.join(s.name for s in SECTIONS if s.own_options)}); got {takers or 'none'}")
    return args, rest, sections


def main(argv=None) -> int:
    """Run the sections named by ``--only`` in order (the side-by-side ones together, first).

    argv: the command line after ``python -m benchmarks`` (default ``sys.argv[1:]``). Returns the exit status.
    """
    given = sys.argv[1:] if argv is None else list(argv)
    args, rest, sections = parse(given)
    if args.list:
        width = max(len(s.name) for s in SECTIONS)  # the help texts in one column, whatever the longest name
        for s in SECTIONS:
            print(f"{s.name:<{width}} {s.number or '':>1}  {s.help}")
        return 0
    status = 0
    compared = {s.number for s in sections if s.number}
    if compared:
        from .suite import run

        command = " ".join(["python -m benchmarks"] + [shlex.quote(a) for a in given])
        status = run(args, compared, command) or status
    for s in sections:
        if s.run is not None:
            status = s.run(args, rest if s.own_options else []) or status
    return status
