"""Per-rank checkpoint jobs on real gloo processes (importable by spawned processes): each rank saves its own
entry file with no collective, and a rank restoring at another dp reads only the files it needs.

The configuration is ``benchmarks.ranks.base_plan``'s (tiny JSONL data); rows are written per rank and the test
compares the global batches with an uninterrupted single-rank run.
"""
from __future__ import annotations

import json
import os

import torch.distributed as dist

from benchmarks.ranks import base_plan, rank_loader, run_rank
from zephon.checkpoint import canonical_json
from zephon.host import StepAgreement, load_rank_states, save_rank_state


def rank_job(rank, world, init_file, spec):
    """One rank: restore (when ``spec["load_dp"]``) from the entry files in ``spec["load"]`` it needs, run to step
    ``spec["stop"]``, save its entry under ``spec["save"]`` (when given), write its rows and what it read to
    ``spec["out"]/rank-{rank}.json``.

    spec: corpus, lanes, start, stop, load, load_dp, save, out."""
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    plan = base_plan(spec["corpus"], spec["lanes"], rows_per_lane_step=2)
    L = rank_loader(plan, world, rank)
    read = []
    if spec.get("load_dp"):
        def read_entry(old):
            path = os.path.join(spec["load"], f"rank-{old}.json")
            read.append(path)
            with open(path) as fh:
                return json.load(fh)
        L.restore(load_rank_states(read_entry, spec["load_dp"], world, rank, spec["lanes"]))
    rows = []
    run_rank(L, spec["stop"] - spec["start"], lambda mb: rows.extend([mb["__step__"], mb["__lane__"], t]
                                                                      for t in mb["text"]))
    if spec.get("save"):  # no collective: this rank's lanes only
        entry = canonical_json(save_rank_state(L.checkpoint(), world, rank)).encode()
        with open(os.path.join(spec["save"], f"rank-{rank}.json"), "wb") as fh:
            fh.write(entry)
    # the end-of-pass vote runs on the default (gloo) group: no group over all ranks is created for data state
    assert StepAgreement().agree(True) and not StepAgreement().agree(rank != 1)
    groups = len(dist.distributed_c10d._world.pg_map)  # process groups this rank holds: the default only
    L.close()
    with open(os.path.join(spec["out"], f"rank-{rank}.json"), "w") as fh:
        json.dump({"rows": rows, "read": [os.path.basename(p) for p in read], "groups": groups}, fh)
    dist.barrier()
    os._exit(0)  # as torch_jobs._leave: gloo may hang while the interpreter finalises
