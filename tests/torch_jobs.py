"""Builders and per-rank job functions for the torch adapter tests (importable by spawned processes).

The configuration mirrors ``helpers.make_loader`` so an uninterrupted single-rank core ``Loader``
(hashed by ``helpers.StepHasher``) is the independent reference for every torch run.
"""
from __future__ import annotations

import contextlib
import hashlib
import json
import os
from collections import defaultdict

import numpy as np
import torch
import torch.distributed as dist

from zephon.formats import open_dataset
from zephon.ops import Batch, Decode, Pack, Shuffle, Tokenize

R = 8  # canonical_replicas
FIELD_DTYPES = {"input_ids": np.int32, "labels": np.int32, "position_ids": np.int32, "attention_mask": np.uint8}


def make_dataset(dirs, tok, *, dp, rank, micro_batch=1, runner="inline", worker_runner=None,
                 exhaustion="repeat"):
    """``ZephonIterableDataset`` with ``helpers.make_loader``'s defaults (global batch 2 * R rows)."""
    import zephon_torch

    ops = [Decode("text"), Tokenize(tok, eos_id="<eos>", max_length=128), Pack(128), Shuffle(4, seed=0),
           Batch(micro_batch)]
    return zephon_torch.ZephonIterableDataset(
        [open_dataset(d) for d in dirs], ops, dp_degree=dp, dp_rank=rank, runner=runner, num_workers=2,
        worker_runner=worker_runner, seed=0, canonical_replicas=R, chunk_size=32, global_batch_size=2 * R,
        flush_every_k_chunks=2, unit_size=32, exhaustion=exhaustion)


def small_corpus(corpus: dict, root, docs: int = 120) -> list[str]:
    """Two one-shard JSONL datasets of ``docs`` documents each (a finite stream ends within ~20 steps)."""
    out = []
    for name in ("docs_jsonl", "code_jsonl"):
        src = os.path.join(corpus[name], "part-0.jsonl")
        d = os.path.join(str(root), "small_" + name)
        os.makedirs(d, exist_ok=True)
        with open(src) as fh, open(os.path.join(d, "part-0.jsonl"), "w") as out_fh:
            for i, line in zip(range(docs), fh):
                out_fh.write(line)
        out.append(d)
    return out


def rows_of(batch) -> list[tuple[int, int, bytes]]:
    """``(step, lane, row bytes in the core's dtypes)`` for each row of a local micro-batch (``__lane__`` per
    row), or of one lane's micro-batch (``__lane__`` a number: the dataset's own items under a plain loader)."""
    out = []
    lane = batch["__lane__"]
    n = len(batch["input_ids"])
    lanes = [int(lane)] * n if getattr(lane, "ndim", 0) == 0 and not isinstance(lane, list) else lane
    for i in range(n):
        raw = b"".join(batch[f][i].numpy().astype(t).tobytes() for f, t in FIELD_DTYPES.items())
        out.append((int(batch["__step__"]), int(lanes[i]), raw))
    return out


def step_digests(rows) -> dict[int, str]:
    """Per step: SHA-256 over rows, lanes ascending, delivery order within a lane (as StepHasher)."""
    by = defaultdict(lambda: defaultdict(list))
    for step, lane, raw in rows:
        by[step][lane].append(raw)
    return {s: hashlib.sha256(b"".join(r for lane in sorted(ls) for r in ls[lane])).hexdigest()
            for s, ls in by.items()}


def consume(dl, until_step: int, micro_per_step: int):
    """Iterate ``dl`` until the last local micro-batch of step ``until_step - 1``; returns the rows."""
    rows = []
    if until_step <= 0:
        return rows
    for b in dl:
        rows.extend(rows_of(b))
        if b["__step__"] == until_step - 1 and b["__micro__"] == micro_per_step - 1:
            break
    return rows


def _init(rank, world, init_file):
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)


def _leave():
    """End a rank that succeeded: a last barrier, then ``os._exit(0)``. torch 2.7.0's gloo can hang in
    ``destroy_process_group`` or abort ("terminate called without an active exception") while the
    interpreter finalises (pytorch/pytorch#75097); four bare spawned ranks doing init / gather_object /
    destroy, with no Zephon code, hung within 3 runs here, and 12 of 12 runs ended cleanly this way. A rank
    that fails raises instead, so mp.spawn reports its error."""
    dist.barrier()
    os._exit(0)


def loader_job(rank, world, init_file, spec):
    """One rank of a torch.distributed run over ``zephon_torch.StatefulDataLoader``, saving and restoring as a
    StatefulDataLoader user does: each rank its own ``state_dict()`` in its own file.

    ``spec``: dirs, tok, num_workers, micro_batch, start (step the run begins at), stop, load (directory of
    ``rank-{r}.json`` files or None: restored through ``zephon_torch.SavedRanks.from_directory``), save
    (directory or None: this rank writes ``rank-{rank}.json`` there), out (rank 0 writes ``{"digests": ...,
    "reads": per rank the old ranks read, "state_lanes": per rank the lanes its state holds}`` there).
    Rows are gathered on rank 0, which hashes each global batch."""
    import zephon_torch

    _init(rank, world, init_file)
    ds = make_dataset(spec["dirs"], spec["tok"], dp=world, rank=rank, micro_batch=spec["micro_batch"],
                      exhaustion=spec.get("exhaustion", "repeat"))
    dl = zephon_torch.StatefulDataLoader(ds, num_workers=spec["num_workers"])
    reads = None
    if spec.get("load"):
        saved = zephon_torch.SavedRanks.from_directory(spec["load"])
        dl.load_state_dict(saved)
        reads = saved.read
    rows = consume(dl, spec["stop"], 2 // spec["micro_batch"])
    lanes = None
    if spec.get("save"):  # no collective: this rank's lanes only
        state = dl.state_dict()
        lanes = [e["lane"] for e in state["lanes"]]
        with open(os.path.join(spec["save"], f"rank-{rank}.json"), "w") as fh:
            json.dump(state, fh)
    gathered = [None] * world if rank == 0 else None
    dist.gather_object({"rows": rows, "reads": reads, "lanes": lanes,
                        "groups": len(dist.distributed_c10d._world.pg_map)}, gathered, dst=0)
    if rank == 0:
        all_rows = [r for part in gathered for r in part["rows"]]
        with open(spec["out"], "w") as fh:
            json.dump({"digests": step_digests(all_rows), "dropped_rows": dl.dropped_rows,
                       "reads": [p["reads"] for p in gathered], "state_lanes": [p["lanes"] for p in gathered],
                       "groups": [p["groups"] for p in gathered]}, fh)
    del dl  # shuts its workers down before the abrupt exit
    _leave()


def keep_row(record) -> bool:
    """Keep about 70% of the ``row <i>`` texts, scattered by a multiplicative hash of ``i`` (lanes, hence
    ranks, then hold different row counts)."""
    return int(record["text"].split()[1]) * 2654435761 % 1000 >= 300


def uneven_tail_job(rank, world, init_file, spec):
    """One rank of a finite text pass with ``drop_last=False`` whose ranks hold different row counts, in a
    DDP-shaped loop (an ``all_reduce`` after every batch, with a short process-group timeout so a rank
    left waiting fails the test instead of hanging it). Rank 0 writes every rank's batch count, texts and
    ``dropped_rows`` to ``spec["out"]``."""
    from datetime import timedelta

    import zephon_torch
    from zephon import Batch, Decode, Filter, open_dataset

    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world,
                            timeout=timedelta(seconds=60))
    ds = zephon_torch.ZephonIterableDataset(
        [open_dataset(spec["dir"])], [Decode("text"), Filter(keep_row), Batch(1, drop_last=False)],
        dp_degree=world, dp_rank=rank, canonical_replicas=4, global_batch_size=8, chunk_size=spec["chunk_size"],
        exhaustion="stop", seed=0)
    dl = zephon_torch.DataLoader(ds, num_workers=spec["num_workers"])
    batches, texts, padding, rows = 0, [], 0, []
    for mb in dl:
        batches += 1
        rows.append(len(mb["text"]))
        pad = mb.get("__pad__", torch.zeros(len(mb["text"]), dtype=torch.bool)).tolist()
        texts.extend(t for t, p in zip(mb["text"], pad) if not p)
        padding += sum(pad)
        dist.all_reduce(torch.ones(1))  # what DDP does every step
    mine = {"batches": batches, "texts": texts, "dropped_rows": dl.dropped_rows, "padding": padding,
            "rows": sorted(set(rows))}
    gather_json(rank, world, mine, spec["out"])
    del dl
    _leave()


def gather_json(rank: int, world: int, obj, path: str) -> None:
    """Gather every rank's ``obj`` on rank 0, which writes the list (rank order) to ``path`` as JSON."""
    gathered = [None] * world if rank == 0 else None
    dist.gather_object(obj, gathered, dst=0)
    if rank == 0:
        with open(path, "w") as fh:
            json.dump(gathered, fh)


# -- a TorchTitan-shaped loop --------------------------------------------------------------------------
class TinyLM(torch.nn.Module):
    def __init__(self, vocab=1000, dim=16):
        super().__init__()
        self.emb = torch.nn.Embedding(vocab, dim)
        self.out = torch.nn.Linear(dim, vocab)

    def forward(self, tokens):
        return self.out(self.emb(tokens))


def titan_job(rank, world, init_file, spec):
    """TorchTitan-shaped training: ``ZephonTextDataLoader``, a tiny model, AdamW, gradients averaged
    over ranks with all_reduce, DCP save/load of model + optimizer + data loader.

    ``spec``: path (dataset_path), tok, num_workers, steps (train until this global step), ckpt_load,
    ckpt_save (DCP directories or None), out (rank 0 writes per-step losses and batch digests)."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    from zephon_torch.titan import ZephonTextDataLoader

    _init(rank, world, init_file)
    torch.manual_seed(0)
    model = TinyLM()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    cfg = ZephonTextDataLoader.Config(dataset_path=spec["path"], canonical_replicas=R, shuffle_buffer=4,
                                      chunk_size=32, num_workers=spec["num_workers"])
    loader = ZephonTextDataLoader(cfg, dp_world_size=world, dp_rank=rank, tokenizer=spec["tok"], seq_len=64,
                                  local_batch_size=16 // world)
    step, reads = 0, []
    if spec.get("ckpt_load"):
        msd, osd = get_state_dict(model, opt)
        state = {"model": msd, "optim": osd, "dataloader": loader, "step": torch.zeros(1, dtype=torch.long)}
        loader.prepare_load(spec["ckpt_load"])  # what TorchTitan's load does through ZephonCheckpointManager
        with _spy_dcp_reads(reads, "dataloader."):
            dcp.load(state, checkpoint_id=spec["ckpt_load"])
        set_state_dict(model, opt, model_state_dict=state["model"], optim_state_dict=state["optim"])
        step = int(state["step"].item())
    losses, rows = {}, []
    it = iter(loader)
    while step < spec["steps"]:
        inputs, labels = next(it)
        for i in range(labels.shape[0]):  # per row, so the global batch hash ignores the dp split
            rows.append((step, rank, b"".join(t[i].numpy().astype(np.int64).tobytes()
                                              for t in (inputs["input"], inputs["positions"], labels))))
        logits = model(inputs["input"])
        loss_sum = torch.nn.functional.cross_entropy(logits.flatten(0, 1), labels.flatten(), ignore_index=-100,
                                                     reduction="sum")
        count = (labels != -100).sum().to(torch.float32)
        totals = torch.stack([loss_sum.detach(), count])
        dist.all_reduce(totals)
        opt.zero_grad()
        (loss_sum / totals[1]).backward()  # the global mean: gradients summed over ranks below
        for p in model.parameters():
            dist.all_reduce(p.grad)
        opt.step()
        losses[step] = float(totals[0] / totals[1])
        step += 1
    if spec.get("ckpt_save"):
        msd, osd = get_state_dict(model, opt)
        dcp.save({"model": msd, "optim": osd, "dataloader": loader,
                  "step": torch.tensor([step], dtype=torch.long)}, checkpoint_id=spec["ckpt_save"])
    gathered, all_reads = ([None] * world, [None] * world) if rank == 0 else (None, None)
    dist.gather_object(rows, gathered, dst=0)
    dist.gather_object(reads, all_reads, dst=0)
    if rank == 0:
        # A global batch: every rank's local batch of that step, ranks in order (= lanes ascending).
        by_step = defaultdict(list)
        for part in gathered:
            for s, r, raw in part:
                by_step[s].append((r, raw))
        digests = {s: hashlib.sha256(b"".join(raw for _, raw in sorted(v, key=lambda x: x[0]))).hexdigest()
                   for s, v in by_step.items()}
        with open(spec["out"], "w") as fh:
            json.dump({"losses": losses, "digests": digests, "reads": all_reads}, fh)
    _leave()


@contextlib.contextmanager
def _spy_dcp_reads(reads: list, prefix: str):
    """Record ``(key, bytes)`` of every item DCP's FileSystemReader reads whose key starts with ``prefix``:
    what was read from storage, seen below the code under test."""
    from torch.distributed.checkpoint import FileSystemReader

    original = FileSystemReader.read_data

    def read_data(self, plan, planner):
        reads.extend((ri.storage_index.fqn, self.storage_data[ri.storage_index].length) for ri in plan.items
                     if ri.storage_index.fqn.startswith(prefix))
        return original(self, plan, planner)
    FileSystemReader.read_data = read_data
    try:
        yield
    finally:
        FileSystemReader.read_data = original


def spawn_ranks(fn, world, tmp, spec) -> list:
    """Run ``fn(rank, world, init_file, spec)`` on ``world`` spawned processes, ``spec["out"]`` a fresh directory
    where rank r writes ``rank-{r}.json``; returns those, in rank order."""
    import torch.multiprocessing as mp

    out = os.path.join(tmp, f"out-{os.urandom(4).hex()}")
    os.makedirs(out)
    mp.spawn(fn, args=(world, os.path.join(tmp, f"init-{os.urandom(4).hex()}"), dict(spec, out=out)),
             nprocs=world, join=True)
    results = []
    for r in range(world):
        with open(os.path.join(out, f"rank-{r}.json")) as fh:
            results.append(json.load(fh))
    return results


def spawn(fn, world, tmp, spec):
    """Run ``fn(rank, world, init_file, spec)`` on ``world`` spawned processes; returns rank 0's JSON."""
    import torch.multiprocessing as mp

    init_file = os.path.join(tmp, f"init-{os.urandom(4).hex()}")
    spec = dict(spec, out=os.path.join(tmp, f"out-{os.urandom(4).hex()}.json"))
    mp.spawn(fn, args=(world, init_file, spec), nprocs=world, join=True)
    with open(spec["out"]) as fh:
        return json.load(fh)
