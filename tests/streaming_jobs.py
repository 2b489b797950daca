"""zephon_streaming ranks on real gloo processes (importable by spawned processes), called as Composer calls the
dataset: ``state_dict(num_samples, True)`` on every rank, the object of rank 0 kept, ``load_state_dict`` of that
object on every rank of the next run.
"""
from __future__ import annotations

import json
import os

import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.default_planner import DefaultSavePlanner
from torch.utils.data import DataLoader

GBS, CHUNK = 16, 4  # global batch; 16 lanes (num_canonical_nodes defaults to the global batch)


def make_streaming(local: str, world: int):
    """The dataset of ``test_streaming_adapter.make`` without ``aggregate_dir`` (torch.distributed is up)."""
    from zephon_streaming import StreamingDataset

    return StreamingDataset(local=local, split="train", batch_size=GBS // world, shuffle=True, shuffle_seed=17,
                            chunk_size=CHUNK)


def streaming_job(rank, world, init_file, spec):
    """One rank: load ``spec["load"]`` (rank 0's saved state) if given, iterate steps until ``spec["stop"]`` of
    the epoch, call ``state_dict(stop * GBS, True)`` when ``spec["save"]`` (rank 0 writes its result there), and
    write its rows, the lanes its state holds and the process groups it holds to ``spec["out"]/rank-{rank}.json``.

    Composer's sharded (FSDP) checkpoints go through torch.distributed.checkpoint: ``spec["dcp_save"]`` saves as
    ``composer.utils.checkpoint._save_checkpoint`` does (0.32.1), ``spec["dcp_load"]`` loads as
    ``load_sharded_checkpoint`` does.

    spec: local, start, stop, load, save, dcp_save, dcp_load, num_workers, out."""
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    ds = make_streaming(spec["local"], world)
    if spec.get("load"):
        with open(spec["load"]) as fh:
            ds.load_state_dict(json.load(fh))
    if spec.get("dcp_load"):  # Composer's load_sharded_checkpoint: a template from state.state_dict(), DCP fills it
        template = {"state": {"dataset_state": {"train": ds.state_dict(0, True), "eval": {}}}}
        dcp.load(template, storage_reader=dcp.FileSystemReader(spec["dcp_load"]))
        ds.load_state_dict(template["state"]["dataset_state"]["train"])
    rows = []
    dl = DataLoader(ds, batch_size=ds.batch_size, num_workers=spec.get("num_workers", 0))
    for step, batch in zip(range(spec["start"], spec["stop"]), dl):
        rows.append([step, list(zip(batch["id"].tolist(), batch["text"]))])
    lanes = None
    if spec.get("save"):
        state = ds.state_dict(spec["stop"] * GBS, True)
        lanes = sorted(e["lane"] for e in json.loads(state["loader"])["lanes"])
        if rank == 0:
            with open(spec["save"], "w") as fh:
                json.dump(state, fh)
        if spec.get("dcp_save"):  # Composer's sharded _save_checkpoint: every rank, DCP keeps the lowest rank's
            dcp.save({"state": {"dataset_state": {"train": state, "eval": {}}}},
                     storage_writer=dcp.FileSystemWriter(spec["dcp_save"]),
                     planner=DefaultSavePlanner(dedup_save_to_lowest_rank=True))
    groups = len(dist.distributed_c10d._world.pg_map)  # process groups this rank holds
    del dl
    with open(os.path.join(spec["out"], f"rank-{rank}.json"), "w") as fh:
        json.dump({"rows": rows, "lanes": lanes, "rank_lanes": ds.rank_lanes, "groups": groups}, fh)
    dist.barrier()
    ds.close()
    os._exit(0)  # as torch_jobs._leave: gloo may hang while the interpreter finalises
