"""``zephon explain`` (what a global step holds) and ``zephon diff`` (what a config change moves), on the
pipeline the CLI's flags describe (the demo corpus when no ``--data`` is given). See docs/debugging.md."""
from __future__ import annotations

import json
import shlex
import sys


def _steps(text: str) -> range:
    """``N`` or ``A:B`` (steps A..B-1) as a range. Raises ``ValueError`` for anything else."""
    try:
        a, _, b = text.partition(":")
        r = range(int(a), int(b) if b else int(a) + 1)
    except ValueError:
        raise ValueError(f"steps must be N or A:B (steps A..B-1), got {text!r}") from None
    if not r or r.start < 0:
        raise ValueError(f"steps {text!r}: need 0 <= A < B")
    return r


def verify_skip(args):
    """``zephon verify --skip A:B`` as ``(A, B)`` (None without it, and for ``zephon demo``, which has no
    ``--skip``); says so on stderr when B is past ``--steps`` (the reference then runs further). Raises
    ``ValueError`` unless ``--checkpoint-step <= A < min(B, --steps)``."""
    if not getattr(args, "skip", None):
        return None
    r = _steps(args.skip)
    if r.start < args.checkpoint_step:
        raise ValueError(f"--skip {args.skip} starts before --checkpoint-step {args.checkpoint_step}")
    if r.start >= args.steps:
        raise ValueError(f"--skip {args.skip} starts at or after --steps {args.steps}: no verified step skips")
    if args.steps < r.stop:  # not wrong (the resumes then deliver steps past B), but costly: say so
        print(f"zephon verify: --skip {args.skip} reaches past --steps {args.steps}: the reference runs "
              f"{args.steps + r.stop - r.start} steps to reach what the resumes deliver", file=sys.stderr)
    return r.start, r.stop


#: ``zephon explain`` without ``--checkpoint`` replays every lane from step 0 (the CLI's pipeline packs, so a span's
#: row count depends on the data): about 0.07 s per global step on the demo (64 lanes of 2048 tokens), so it
#: refuses steps past this (``--max-replay-steps``) instead of running for hours (docs/debugging.md).
MAX_REPLAY_STEPS = 2000


def _check_replay(args) -> None:
    """Refuse ``explain`` steps past ``--max-replay-steps`` without ``--checkpoint`` (before any work). Raises
    ``ValueError`` saying what to pass."""
    last = _steps(args.step).stop - 1
    bound = args.max_replay_steps
    if args.checkpoint is None and bound and last > bound:
        raise ValueError(f"explain {args.step} without --checkpoint replays every lane from step 0 to step {last} "
                         f"(at about 0.07 s per step, as on the demo's 64 lanes: {last * 0.07 / 3600:,.1f} h): "
                         f"pass --checkpoint with a checkpoint of the run at or before step {last}, or raise "
                         f"--max-replay-steps "
                         f"({bound}; 0 = no bound)")


def _plan(args):
    """The ``LoaderPlan`` of the CLI's pipeline flags at ``--dp`` (the demo corpus and tokenizer by default)."""
    from .cli_pipeline import build_pipeline
    from .demo_corpus import build_corpus, build_tokenizer, default_workdir

    tok = args.tokenizer
    if tok is None or not args.data:
        workdir = default_workdir()
        corpus = build_corpus(workdir)
        tok = tok or build_tokenizer(workdir, [corpus["source_jsonl"], corpus["docstrings_jsonl"]])
        if not args.data:
            args.data = [corpus["source_jsonl"], corpus["docstrings_jsonl"]]
            args.weights = args.weights or "0.7,0.3"
    from .work import TopologyError

    _, make_loader = build_pipeline(args, tok)
    try:
        L = make_loader(args.dp, 0, args.micro_batch, "inline")
    except TopologyError as e:
        raise TopologyError(f"--dp {args.dp} (--micro-batch {args.micro_batch}) with --canonical-replicas "
                            f"{args.canonical_replicas}: {e}") from None
    with L:
        return L.plan


def _load(path: str | None):
    """The ``--checkpoint`` file's JSON (None without one). Raises ``ValueError`` naming the file when it is not
    JSON (OSError, naming it, when it does not open)."""
    if path is None:
        return None
    with open(path, encoding="utf-8") as fh:
        try:
            return json.load(fh)
        except ValueError as e:  # JSONDecodeError, or bytes that are not UTF-8: say which file
            raise ValueError(f"--checkpoint {path}: not valid JSON (a checkpoint is the JSON a Loader's "
                             f"checkpoint() returns): {e}") from None


def format_explain(ex: dict, text: bool = False) -> str:
    """``explain``'s result as a table: one line per document piece (a packed row has several)."""
    lines = [f"steps {ex['steps'][0]}..{ex['steps'][1] - 1}: {ex['rows_per_lane_step']} rows per lane, micro-batches "
             f"of {ex['micro_batch_size']}; skipped steps {ex['skips'] or 'none'}; at most "
             f"{ex['replayed_pointers']} pointers replayed per lane",
             "step  (stream)  lane rank micro row  dataset  shard sample   tokens       file:line [bytes]"]
    for r in ex["rows"]:
        head = f"{r['step']:>4}  ({r['stream_step']:>6})  {r['lane']:>4} {r['rank']:>4} {r['micro']:>5} {r['row']:>3}"
        if not r["pieces"]:
            lines.append(f"{head}  {'padding' if r['pad'] else '(no row)'}")
        for p in r["pieces"]:
            where = f"{p['file']}:{p['line']} [{p['bytes'][0]}, {p['bytes'][1]})" if "line" in p else p["file"]
            tokens = "" if p["tokens"] is None else f"{p['tokens'][0]}-{p['tokens'][1]}"
            tokens += f" #{p['piece']}" if p["piece"] else ""
            lines.append(f"{head}  {p['dataset_name']:<8} {p['shard']:>5} {p['sample']:>6}   {tokens:<12} {where}")
            if text:
                lines += ["    | " + t for t in p.get("text", "").splitlines()] + [""]
    return "\n".join(lines)


def cmd_explain(args) -> int:
    """Print every row of the global steps ``args.step`` (table, or ``--json``)."""
    from .engine.explain import explain, rows_are_pointers

    _check_replay(args)
    state = _load(args.checkpoint)  # before the pipeline is built: a bad file fails at once
    plan = _plan(args)
    if args.skip and state is None:
        raise ValueError("--skip needs --checkpoint: a skip applies to a resume from that checkpoint")
    if args.skip:
        a, b = _steps(args.skip).start, _steps(args.skip).stop
        plan = plan.with_restored_skips(state, (a, b))
        state = {**state, "config": plan.summary}  # what the resumed run's checkpoints will say
    if state is None and not rows_are_pointers(plan):
        print("zephon explain: no --checkpoint, so each lane replays from step 0 (how many packed or filtered rows a "
              "span gives depends on the data); pass a checkpoint at or before the step to replay one span",
              file=sys.stderr)
    ex = explain(plan, _steps(args.step), state=state, text_field=args.field if args.text else None)
    print(json.dumps(ex, indent=1) if args.json else format_explain(ex, args.text))
    return 0


def cmd_diff(args) -> int:
    """Compare the pipeline of the flags with the same flags plus ``--against``'s: the first differing global step,
    documents moved per dataset (table, or ``--json``)."""
    from .engine.diff import compare_plans

    state = _load(args.checkpoint)
    old = _plan(args)
    against = shlex.split(args.against)
    new = _plan(args.parser.parse_args(_without_against(args.argv, against) + against))
    report = compare_plans(old, new, args.compare_steps, state=state)
    if args.json:
        print(json.dumps(report, indent=1))
        return 0
    s = report["first_differing_step"]
    lo, hi = report["steps"]
    print(f"config: {'; '.join(report['config']) or 'no difference in the summary'}")
    print(f"first global step whose batch differs: {s if s is not None else f'none in steps {lo}..{hi - 1}'}")
    for name, n in report["moved"].items():
        print(f"  {name}: {n} document pieces moved in steps {lo}..{hi - 1}")
    return 0


def _without_against(argv: list, against: list) -> list:
    """``argv`` (the command line of ``zephon diff``) with ``--against``'s value emptied and every flag that
    ``against`` (its tokens) gives removed with its value (a token after a flag not starting with ``--``): the
    changed flags are appended after it and replace those (``--data`` too, which otherwise appends)."""
    given = {t.split("=", 1)[0] for t in against if t.startswith("--")}
    out, i = [], 0
    while i < len(argv):
        tok = argv[i]
        name = tok.split("=", 1)[0]
        if name == "--against" or (tok.startswith("--") and name in given):
            takes = "=" not in tok and (name == "--against" or (i + 1 < len(argv) and not argv[i + 1].startswith("--")))
            i += 1 + takes
            out += ["--against", ""] if name == "--against" else []
        else:
            out.append(tok)
            i += 1
    return out


def add_parsers(sub, pipeline_args, format_args) -> None:
    """The ``explain`` and ``diff`` subcommands (``pipeline_args(p)``, ``format_args(p)``: the shared flags)."""
    ex = sub.add_parser("explain", help="every row of a global step: lane, dataset, file:line, sample, token spans")
    ex.add_argument("step", help="global step N, or A:B for steps A..B-1")
    ex.add_argument("--text", action="store_true", help="print each document's text")
    ex.add_argument("--skip", default=None, help="A:B: explain a resume from --checkpoint that skips steps A..B-1")
    ex.add_argument("--max-replay-steps", type=int, default=MAX_REPLAY_STEPS,
                    help=f"without --checkpoint, refuse steps past this (lanes replay from step 0; default "
                         f"{MAX_REPLAY_STEPS}, 0 = no bound)")
    diff = sub.add_parser("diff", help="first global step a config change moves, documents moved per dataset")
    diff.add_argument("--against", required=True, help="the changed flags, quoted (e.g. \"--shuffle-buffer 64\")")
    diff.add_argument("--compare-steps", type=int, default=50, help="global steps compared (default 50)")
    for p in (ex, diff):
        p.add_argument("--data", action="append", default=None, help="dataset path (default: the demo corpus)")
        p.add_argument("--weights", default=None, help="comma-separated mixture weights, one per --data")
        p.add_argument("--schedule", default=None, help="YAML/JSON mixture schedule (see docs/curricula.md)")
        p.add_argument("--tokenizer", default=None, help="tokenizer.json (default: the demo's)")
        p.add_argument("--checkpoint", default=None, help="a saved (merged) checkpoint JSON of the run: lanes replay "
                                                          "from it, its skipped steps apply")
        p.add_argument("--json", action="store_true")
        pipeline_args(p, demo=False, debug=True)
        format_args(p)


def run(args) -> int:
    """Dispatch ``explain`` / ``diff`` (the caller maps errors to exit 2)."""
    return {"explain": cmd_explain, "diff": cmd_diff}[args.cmd](args)

