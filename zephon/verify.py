"""Elastic determinism check: an uninterrupted single-rank reference against a run checkpointed on
``dp`` ranks and resumed on other dp degrees (ranks simulated in this process).

The reference is the independent oracle: one rank owning every lane, never interrupted. Every
global batch of the other runs must hash the same, step for step.
"""
from __future__ import annotations

import json
import time
from dataclasses import dataclass, field

from .checkpoint import canonical_json, merge_states
from .checkpoint.skips import stream_step
from .engine import GlobalBatchHasher, make_runner
from .host import load_rank_states, save_rank_state


@dataclass
class Phase:
    """One simulated run: its dp degree, runner, micro-batch size and the steps it covers."""
    name: str
    dp: int
    start: int
    stop: int
    runner: str = "threads"
    workers: int = 2
    micro_batch: int = 1
    digests: dict = field(default_factory=dict)
    first_batch_s: float = 0.0
    seconds: float = 0.0
    cold: "Phase | None" = None  # for a resume: a fresh start with the same dp and runner
    entries_read: int = 0  # a resume: the most rank entries one of its ranks read
    bytes_read: int = 0  # ... and the most bytes


class TextField:
    """Put an Energon sample's text at the top level, where ``Decode(field)`` reads it (picklable, for the
    processes runner): ``record[field]`` from its ``field_map`` fields (``__fields__``), else from its parts
    (``__parts__``). A record that already has ``field`` passes unchanged.

    field: a field_map field (e.g. ``text``) or a part name (e.g. ``txt``).
    Raises ValueError naming the fields and parts the sample has (``Map`` adds file, shard and sample).
    """

    def __init__(self, field: str):
        self.field = field

    def __call__(self, record: dict) -> dict:
        f = self.field
        if f in record:
            return record
        fields, parts = record.get("__fields__") or {}, record.get("__parts__") or {}
        if f in fields:
            record[f] = fields[f]
        elif f in parts:
            record[f] = parts[f]
        else:
            raise ValueError(f"no field_map field or part {f!r} in this Energon sample (fields: {sorted(fields)}, "
                           f"parts: {sorted(parts)}); pass --field with one of them (and --part-filter if the part "
                           f"is filtered out)")
        return record


def run_phase(make_loader, phase: Phase, restore_from: dict | None = None, progress=None, skip=None) -> list:
    """Run ``phase`` with ``phase.dp`` loaders sharing one runner; hash every global step in
    ``[start, stop)``. ``make_loader(dp, rank, micro_batch, runner) -> Loader``. ``restore_from``: a merged
    checkpoint, or ``(saved_dp, {old rank: entry JSON bytes})`` per-rank entries, each new rank reading only the
    ones it needs (counted in ``phase.entries_read`` / ``bytes_read``). ``skip``: steps ``(a, b)`` the restore
    skips (``Loader.restore``'s ``skip_steps``). Returns the loaders (so the caller can checkpoint them); closes
    the shared runner."""
    t0 = time.perf_counter()
    stage = make_loader(1, 0, phase.micro_batch, "inline").plan.stage  # what the shared runner's workers run
    runner = make_runner(phase.runner, stage, phase.workers)
    try:
        loaders = [make_loader(phase.dp, r, phase.micro_batch, runner) for r in range(phase.dp)]
        if isinstance(restore_from, tuple):
            for L in loaders:
                L.restore(_selective(restore_from, L, phase), skip_steps=skip)
        elif restore_from is not None:
            for L in loaders:
                L.restore(restore_from, skip_steps=skip)
        # a rank's rows per step: its lanes' rows, or its block of a lane it shares with other ranks (dp > lanes)
        per_step = [len(L.lanes) * (getattr(L, "rows_per_rank_step", L.rows_per_lane_step) // phase.micro_batch)
                    for L in loaders]
        iters = [iter(L) for L in loaders]
        hasher = GlobalBatchHasher()
        for step in range(phase.start, phase.stop):
            for it, n in zip(iters, per_step):
                for _ in range(n):
                    mb = next(it)
                    if mb["__step__"] != step:
                        raise RuntimeError(f"{phase.name}: expected step {step}, loader gave {mb['__step__']}")
                    hasher.add(mb)
            if step == phase.start:
                phase.first_batch_s = time.perf_counter() - t0
            if progress is not None:
                progress.update(1)
        phase.digests = hasher.digests()
        for it in iters:
            it.close()
        return loaders
    finally:
        runner.close()
        phase.seconds = time.perf_counter() - t0


def _selective(saved, loader, phase: Phase) -> dict:
    """``loader``'s state read from only the per-rank entries ``saved`` (``(saved_dp, {rank: bytes})``) it needs."""
    saved_dp, entries = saved
    read = []

    def read_entry(old: int) -> dict:
        read.append(len(entries[old]))
        return json.loads(entries[old])

    state = load_rank_states(read_entry, saved_dp, loader.dp_degree, loader.dp_rank, loader.canonical_replicas)
    phase.entries_read, phase.bytes_read = max(phase.entries_read, len(read)), max(phase.bytes_read, sum(read))
    return state


def elastic_verify(make_loader, *, dp: int, resume_dps, checkpoint_step: int, steps: int,
                   runner: str = "threads", workers: int = 2, micro_batch: int = 1,
                   resume_runner: str | None = None, resume_workers: int | None = None,
                   resume_micro_batch: int | None = None, progress=None, skip=None) -> dict:
    """Reference (dp 1, steps ``[0, steps)``), a run on ``dp`` ranks to ``checkpoint_step``, then one
    resume per entry of ``resume_dps`` to ``steps``, each rank of a resume restoring from only the per-rank entries
    (``zephon.host.save_rank_state``) that hold its lanes. Returns a report dict: phases, per-step digests,
    checkpoint (the merged global state, JSON-round-tripped), its size in bytes, ``rank_entry_bytes`` (the
    largest per-rank entry), ``mismatches`` (``[(phase, first differing step)]``) and ``metrics`` (the reference
    run's ``Loader.metrics()``). ``skip``: ``(a, b)``, steps the resumes skip (``checkpoint_step <= a``): resumed
    step ``t`` must then hash as the reference's ``checkpoint.skips.stream_step(t)``."""
    if not 0 < checkpoint_step < steps:
        raise ValueError(f"need 0 < checkpoint_step ({checkpoint_step}) < steps ({steps})")
    skips = [list(skip)] if skip else []
    ref = Phase("reference dp=1", 1, 0, stream_step(steps - 1, skips) + 1, runner, workers, micro_batch)
    ref_metrics = run_phase(make_loader, ref, progress=progress)[0].metrics()
    first = Phase(f"dp={dp}", dp, 0, checkpoint_step, runner, workers, micro_batch)
    loaders = run_phase(make_loader, first, progress=progress)
    states = [L.checkpoint() for L in loaders]
    blob = json.dumps(merge_states(states))
    state = json.loads(blob)  # what a training job would write and read back
    entries = {r: canonical_json(save_rank_state(s, dp, r)).encode() for r, s in enumerate(states)}
    resumes = []
    for rdp in resume_dps:
        ph = Phase(f"resume dp={rdp}", rdp, checkpoint_step, steps, resume_runner or runner,
                   resume_workers if resume_workers is not None else workers,
                   resume_micro_batch if resume_micro_batch is not None else micro_batch)
        run_phase(make_loader, ph, restore_from=(dp, entries), progress=progress, skip=skip)
        resumes.append(ph)
    for ph in resumes:  # the fair comparison: a fresh start on the same dp degree and runner
        ph.cold = Phase(f"cold start dp={ph.dp}", ph.dp, 0, 1, ph.runner, ph.workers, ph.micro_batch)
        run_phase(make_loader, ph.cold)
    mismatches = []
    for ph in [first, *resumes]:
        bad = [s for s in range(ph.start, ph.stop) if ph.digests.get(s) != ref.digests.get(stream_step(s, skips))]
        if bad:
            mismatches.append((ph.name, bad[0]))
    return {"reference": ref, "checkpointed": first, "resumes": resumes, "skips": skips,
            "checkpoint": state, "checkpoint_bytes": len(blob.encode()), "mismatches": mismatches,
            "rank_entry_bytes": max(len(b) for b in entries.values()),
            "metrics": ref_metrics}


def format_table(report: dict, rows=None, width: int = 12) -> str:
    """Per-step table of global-batch SHA-256 prefixes: reference, the checkpointed run, each resume (compared, when
    the resumes skip steps, with the reference step they deliver).
    ``rows``: steps to show (default all). A cell is the prefix, or ``MISMATCH <prefix>``."""
    ref = report["reference"]
    phases = [report["checkpointed"], *report["resumes"]]
    head = ["step", "reference dp=1"] + [p.name for p in phases]
    lines = [" | ".join(f"{h:<{width + 2}}" for h in head)]
    for s in (rows if rows is not None else range(ref.start, ref.stop)):
        cells = [str(s), ref.digests[s][:width]]
        for p in phases:
            d = p.digests.get(s)  # a resume that skips steps delivers the reference's later ones
            want = ref.digests.get(stream_step(s, report.get("skips", [])) if p in report["resumes"] else s)
            cells.append("" if d is None else (d[:width] if d == want else f"MISMATCH {d[:width]}"))
        lines.append(" | ".join(f"{c:<{width + 2}}" for c in cells))
    return "\n".join(lines)
