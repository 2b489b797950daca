"""The two experiments for one loader, data-parallel ranks simulated in one process.

Each simulated rank has its own loader instance; a step concatenates the ranks' rows in rank order (the
global batch) and trains on it in one forward/backward (``model.Trainer``), so only the loader can make
two runs differ. (1) From scratch on ``ckpt_dp`` ranks, checkpoint (model, optimiser, loader) at
``ckpt_step``, resume on each of ``resume_dps`` by the loader's own rules, compare per-step losses with the
uninterrupted run. (2) From scratch on each of ``scratch_dps``: the final held-out loss.
"""
from __future__ import annotations

import hashlib
import time
from dataclasses import dataclass, field, replace

import torch

from .baselines import Refused
from .model import ModelConfig, Trainer

PEERS = ("zephon", "sampler", "titan", "streaming", "energon")


@dataclass(frozen=True)
class Settings:
    """One configuration of the experiment.

    Args:
        rows: global batch (rows of ``model.seq_len`` tokens per step); replicas: Zephon's
            ``canonical_replicas`` (a multiple of every dp degree used).
        steps: training steps of every run; ckpt_step / ckpt_dp: where and on how many ranks the
            checkpoint is taken; resume_dps: rank counts resumed on; scratch_dps: rank counts trained from
            scratch (experiment 2; ``ckpt_dp`` is the checkpointed run itself).
        heldout_rows: held-out rows; eval_every: held-out evaluation interval (steps).
        peers: loaders run; ddp_worlds / ddp_steps: the real-DDP check (gloo ranks, steps).
        chunk_size: Zephon's WorkSource chunk (pointers per lane chunk).
    """
    model: ModelConfig = field(default_factory=ModelConfig)
    rows: int = 64
    replicas: int = 64
    steps: int = 200
    ckpt_step: int = 150
    ckpt_dp: int = 16
    resume_dps: tuple = (8, 32, 64)
    scratch_dps: tuple = (8, 16, 32, 64)
    heldout_rows: int = 128
    eval_every: int = 50
    peers: tuple = PEERS
    ddp_worlds: tuple = (2, 4)
    ddp_steps: int = 5
    chunk_size: int = 8


FULL = Settings()
QUICK = Settings(model=ModelConfig(d_model=32, layers=1, seq_len=32, steps=12, warmup=2), rows=16, replicas=16,
                 steps=12, ckpt_step=6, ckpt_dp=4, resume_dps=(2, 8, 16), scratch_dps=(2, 4, 8, 16),
                 heldout_rows=32, eval_every=6, ddp_steps=4)


def make_peer(name: str, m: dict, s: Settings):
    from . import baselines, hosts

    if name == "zephon":
        return baselines.Zephon(m, s.rows, s.replicas, chunk_size=s.chunk_size)
    cls = {"sampler": baselines.Sampler, "titan": baselines.Titan, "streaming": hosts.Mosaic,
           "energon": hosts.Energon}[name]
    return cls(m, s.rows)


def batch_digest(x: torch.Tensor, y: torch.Tensor) -> tuple[str, str]:
    """SHA-256 (first 16 hex digits) of one global batch: rows in order, and rows as a set (sorted).

    Args:
        x, y: int64 ``[rows, seq]`` inputs and targets."""
    rows = [a.tobytes() + b.tobytes() for a, b in zip(x.numpy(), y.numpy())]
    return (hashlib.sha256(b"".join(rows)).hexdigest()[:16], hashlib.sha256(b"".join(sorted(rows))).hexdigest()[:16])


@dataclass
class Run:
    losses: list = field(default_factory=list)       # training loss per step, nats/token
    digests: list = field(default_factory=list)      # (ordered, as-a-set) global batch digests per step
    heldout: dict = field(default_factory=dict)      # step -> held-out loss
    saved: tuple | None = None                       # (trainer snapshot, loader state) at the checkpoint
    seconds: float = 0.0


def train(peer, s: Settings, heldout, D: int, *, ranks=None, start: int = 0, snap=None, save_at=None,
          stop: int | None = None) -> Run:
    """Train on D simulated ranks from ``start`` to ``s.steps``.

    Args:
        peer: a loader peer (``baselines``); ranks: its rank objects (default ``peer.open(D)``).
        heldout: ``(inputs, targets)`` held-out rows.
        start: first step; snap: trainer snapshot to start from (a resume); save_at: step after which the
            model, optimiser and loader are checkpointed into ``Run.saved``; stop: last step + 1 (default
            ``s.steps``; the schedule is always ``s.steps`` long).
    """
    t0 = time.perf_counter()
    tr = Trainer(replace(s.model, steps=s.steps))
    if snap is not None:
        tr.load(snap)
    ranks = peer.open(D) if ranks is None else ranks
    run = Run()
    stop = s.steps if stop is None else stop
    for step in range(start, stop):
        parts = [next(rk) for rk in ranks]  # rank order = global-batch order
        x, y = torch.cat([p[0] for p in parts]), torch.cat([p[1] for p in parts])
        run.digests.append(batch_digest(x, y))
        run.losses.append(tr.step(x, y, step))
        done = step + 1
        if done % s.eval_every == 0 or done == stop:
            run.heldout[done] = tr.evaluate(*heldout)
        if save_at == done:
            run.saved = (tr.snapshot(), peer.save(ranks, done))
    run.seconds = time.perf_counter() - t0
    return run


def _summary(run: Run, D: int) -> dict:
    return {"dp": D, "losses": run.losses, "digests": run.digests, "heldout": run.heldout,
            "final_heldout": run.heldout[max(run.heldout)], "seconds": round(run.seconds, 2)}


def run_peer(name: str, m: dict, s: Settings, heldout, log=print) -> dict:
    """Both experiments for one loader; returns plain data (JSON-serialisable).

    Keys: ``name``, ``rule`` (how it resumes), ``scratch`` {dp: run}, ``resume`` {dp: run with ``note``,
    ``max_abs_diff``, ``mean_abs_diff``, ``equal_batches`` against the uninterrupted run, or ``refused``}."""
    t0 = time.perf_counter()
    peer = make_peer(name, m, s)
    out = {"name": name, "rule": peer.rule.format(k=s.ckpt_step, n=s.ckpt_dp),
           "scratch": {}, "resume": {}}
    k = s.ckpt_step
    base = train(peer, s, heldout, s.ckpt_dp, save_at=k)
    out["scratch"][s.ckpt_dp] = _summary(base, s.ckpt_dp)
    log(f"  [{name}] dp={s.ckpt_dp} from scratch, checkpoint at step {k}: final held-out "
        f"{out['scratch'][s.ckpt_dp]['final_heldout']:.4f} ({base.seconds:.0f} s)")
    snap, state = base.saved
    for M in s.resume_dps:
        try:
            ranks, note = peer.resume(state, M, k)
        except Refused as e:
            out["resume"][M] = {"dp": M, "refused": str(e)}
            log(f"  [{name}] resume on {M}: refused: {e}")
            continue
        run = train(peer, s, heldout, M, ranks=ranks, start=k, snap=snap)
        ref, got = base.losses[k:], run.losses
        diffs = [abs(a - b) for a, b in zip(ref, got)]
        pairs = list(zip(base.digests[k:], run.digests))
        out["resume"][M] = dict(_summary(run, M), note=note, max_abs_diff=max(diffs),
                                mean_abs_diff=sum(diffs) / len(diffs), equal_batches=sum(a == b for a, b in pairs),
                                same_rows=sum(a[1] == b[1] for a, b in pairs))
        r = out["resume"][M]
        log(f"  [{name}] resume on {M} ({note[:60]}): max |loss - uninterrupted| {max(diffs):.3g}; global batches "
            f"equal {r['equal_batches']}/{len(ref)}, same rows {r['same_rows']}/{len(ref)} ({run.seconds:.0f} s)")
    for D in s.scratch_dps:
        if D == s.ckpt_dp:
            continue
        run = train(peer, s, heldout, D)
        out["scratch"][D] = _summary(run, D)
        log(f"  [{name}] dp={D} from scratch: final held-out {out['scratch'][D]['final_heldout']:.4f} "
            f"({run.seconds:.0f} s)")
    out["seconds"] = time.perf_counter() - t0
    return out
