"""Check of the simulation against real DDP: W gloo ranks (spawned processes), each with its own loader
instance, the model in ``DistributedDataParallel``; the per-step losses are compared with the one-process
simulation of the same W ranks (``experiment.train``).

DDP averages the ranks' gradients; each rank scales its summed token loss by ``W / (tokens in the global
batch)`` so that the average is the global-batch mean, as in the simulation. The two agree up to float
rounding: the all-reduce adds the ranks' partial sums in its own order.
"""
from __future__ import annotations

import json
import os
import tempfile
from dataclasses import replace


def _rank_job(rank: int, world: int, init_file: str, spec: dict) -> None:
    """One DDP rank: ``spec`` = name (peer), m (manifest), settings (``Settings`` kwargs), steps, out."""
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    from .experiment import Settings, make_peer, train
    from .model import ModelConfig, Trainer, lr_at, setup_torch

    os.environ["TQDM_DISABLE"] = "1"
    setup_torch()
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    kw = dict(spec["settings"])
    s = Settings(**dict(kw, model=ModelConfig(**kw["model"])))
    it = make_peer(spec["name"], spec["m"], s).open(world)[rank]  # this rank's loader only is iterated
    tr = Trainer(replace(s.model, steps=s.steps))
    model = DistributedDataParallel(tr.model)
    losses = []
    for step in range(spec["steps"]):
        x, y = next(it)
        for g in tr.opt.param_groups:
            g["lr"] = lr_at(tr.cfg, step)
        logits = model(x)
        loss_sum = torch.nn.functional.cross_entropy(logits.flatten(0, 1), y.flatten(), ignore_index=-100,
                                                     reduction="sum")
        totals = torch.stack([loss_sum.detach(), (y != -100).sum().to(torch.float32)])
        dist.all_reduce(totals)
        tr.opt.zero_grad(set_to_none=True)
        (loss_sum * world / totals[1]).backward()  # DDP averages over ranks: the global-batch mean
        torch.nn.utils.clip_grad_norm_(model.parameters(), tr.cfg.clip)
        tr.opt.step()
        losses.append(float(totals[0] / totals[1]))
    dist.barrier()
    if rank == 0:
        # The simulation of the same ranks in this same process: the very code the DDP ranks ran (the core
        # may change on disk while a long benchmark runs; a process started later would import the change).
        from .data import heldout
        from ..common import core_digest

        sim = train(make_peer(spec["name"], spec["m"], s), s, heldout(spec["m"]), world, stop=spec["steps"]).losses
        with open(spec["out"], "w") as fh:
            json.dump({"real": losses, "simulated": sim, "core": core_digest()}, fh)
    os._exit(0)  # see tests/torch_jobs._leave: gloo may hang while the interpreter finalises


def real_ddp_losses(name: str, m: dict, s, world: int, steps: int) -> dict:
    """Per-step global-batch losses of ``steps`` steps on ``world`` real gloo ranks, and of the one-process
    simulation of those ranks computed afterwards by rank 0.

    Args:
        name: peer name (``experiment.PEERS``); m: data manifest; s: ``experiment.Settings``.
        world: number of processes; steps: steps trained.
    Returns ``{"real": [...], "simulated": [...], "core": digest of the core sources rank 0 imported}``.
    """
    import dataclasses

    import torch.multiprocessing as mp

    with tempfile.TemporaryDirectory() as d:
        spec = {"name": name, "m": m, "settings": dataclasses.asdict(s), "steps": steps,
                "out": os.path.join(d, "losses.json")}
        mp.spawn(_rank_job, args=(world, os.path.join(d, "init"), spec), nprocs=world, join=True)
        with open(spec["out"]) as fh:
            return json.load(fh)


def check(names, m: dict, s, log=print) -> dict:
    """For each peer in ``names`` and each world in ``s.ddp_worlds``: real DDP losses, the simulation's,
    and their largest absolute difference. Returns ``{name: {world: {...}}}``."""
    out = {}
    for name in names:
        out[name] = {}
        for w in s.ddp_worlds:
            r = real_ddp_losses(name, m, s, w, s.ddp_steps)
            diff = max(abs(a - b) for a, b in zip(r["real"], r["simulated"]))
            out[name][w] = dict(r, max_abs_diff=diff)
            log(f"  [ddp] {name} on {w} gloo ranks, {s.ddp_steps} steps: max |DDP - simulation| {diff:.3g}")
    return out
