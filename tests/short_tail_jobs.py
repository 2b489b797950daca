"""Per-rank job of the short-tail tests (``Batch(short_last=True)``), importable by spawned processes."""
from __future__ import annotations

import json
from datetime import timedelta

import torch
import torch.distributed as dist

from torch_jobs import _leave, gather_json

MAX_LEN = 512


def short_ops(micro: int = 2):
    """The packed finite pass of the short-tail tests: bytes tokens, ``Pack(512)``, ``micro`` rows per micro-batch."""
    from zephon import Batch, Decode, Pack, Tokenize

    return [Decode(), Tokenize("bytes", eos_id="<eos>", max_length=MAX_LEN), Pack(MAX_LEN),
            Batch(micro, drop_last=False, short_last=True)]


def loader_kw(micro: int = 2) -> dict:
    """The Loader keywords beside the ops: 8 lanes, ``2 x micro`` rows per lane step."""
    return dict(canonical_replicas=8, global_batch_size=16 * micro, chunk_size=16, exhaustion="stop", seed=0)


def row_docs(ids, mask, pos) -> tuple:
    """The documents starting in a packed row: its records split where ``position_ids`` restart, decoded (bytes
    ids: byte b is b + 3, EOS 2), each text's ``<id>:`` prefix (a later piece of a split document has none)."""
    out, seg = [], []
    for t, m, p in list(zip(ids, mask, pos)) + [(0, 1, 0)]:
        if m and p == 0 and seg:
            text = bytes(x - 3 for x in seg if x > 2).decode()
            head = text.split(":", 1)[0]
            if ":" in text and head.isdigit():
                out.append(head)
            seg = []
        if m:
            seg.append(int(t))
    return tuple(out)


def short_tail_job(rank, world, init_file, spec):
    """One rank of a packed finite pass with ``Batch(short_last=True)`` through ``zephon_torch.DataLoader``, in a
    DDP-shaped loop (an ``all_reduce`` after every batch; a short timeout so a rank left waiting fails the test).
    ``spec``: path, micro (rows per micro-batch), num_workers, load (a state file or None). Rank 0 writes
    every rank's batches as ``(step, micro, rows, shape after rows, tokens, [(lane, docs, tokens), ...])`` to
    ``spec["out"]``."""
    import zephon_torch
    from zephon import open_dataset

    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world,
                            timeout=timedelta(seconds=60))
    ds = zephon_torch.ZephonIterableDataset([open_dataset(spec["path"])], short_ops(spec["micro"]), dp_degree=world,
                                            dp_rank=rank, **loader_kw(spec["micro"]))
    dl = zephon_torch.DataLoader(ds, num_workers=spec["num_workers"])
    if spec.get("load"):
        with open(spec["load"]) as fh:
            dl.load_state_dict(json.load(fh))
    batches = []
    for mb in dl:
        ids, mask, pos, lanes = mb["input_ids"], mb["attention_mask"], mb["position_ids"], mb["__lane__"].tolist()
        batches.append((int(mb["__step__"]), int(mb["__micro__"]), len(ids), list(ids.shape[1:]), int(mask.sum()),
                        [(lane, row_docs(ids[i].tolist(), mask[i].tolist(), pos[i].tolist()), int(mask[i].sum()))
                         for i, lane in enumerate(lanes)]))
        dist.all_reduce(torch.ones(1))  # what DDP does every step
    gather_json(rank, world, batches, spec["out"])
    del dl
    _leave()
