"""Per-rank job functions for real torch.distributed (gloo) runs of zephon_energon (importable by spawned ranks).

Spawning ranks is the slow part, so one job runs several configurations in the same ranks, one after the other.
"""
from __future__ import annotations

import datetime
import json
import os

import torch.distributed as dist


def finite_pass_job(rank, world, init_file, spec):
    """One rank: a whole ``repeat=False, batch_drop_last=True`` pass for each worker count of ``spec["workers"]``.

    ``spec``: path (prepared dataset), batch_size, canonical_replicas, chunk_size, shuffle_buffer_size, workers
    (list of num_workers), out (rank 0 writes there). Rank 0 writes ``{str(num_workers): [per rank: {"batches":
    [[key, ...], ...], "dropped_rows": n}]}``. A collective at the end of each pass (gather_object) means a rank
    that stopped early or late would fail the run at once instead of the test passing."""
    import zephon_energon as ze

    # A rank left waiting fails within the timeout instead of hanging the suite.
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=60))
    out = {}
    for nw in spec["workers"]:
        wc = ze.WorkerConfig(rank=rank, world_size=world, num_workers=nw)
        ds = ze.get_train_dataset(spec["path"], worker_config=wc, batch_size=spec["batch_size"], batch_drop_last=True,
                                  repeat=False, shuffle_buffer_size=spec["shuffle_buffer_size"],
                                  max_samples_per_sequence=None, canonical_replicas=spec["canonical_replicas"],
                                  chunk_size=spec["chunk_size"])
        dl = ze.get_savable_loader(ds)
        mine = {"batches": [list(b.__key__) for b in dl], "dropped_rows": dl.dropped_rows}
        dl.close()
        gathered = [None] * world if rank == 0 else None
        dist.gather_object(mine, gathered, dst=0)
        out[str(nw)] = gathered
    if rank == 0:
        with open(spec["out"], "w") as fh:
            json.dump(out, fh)
    dist.barrier()
    os._exit(0)  # see torch_jobs._leave: gloo may hang while the interpreter finalises
