"""Comparison 5: divergence after a resume at another number of ranks.

Global batch G = 16 samples (documents), a checkpoint after step k on N = 4 data-parallel ranks, a
resume on M ranks (2 and 8). The global batch of a step is the union of the ranks' batches of that
step, compared as a sorted list of sample keys (order inside a global batch does not matter to the
gradient: the most lenient reading for the peers). Counted: of the H steps after the resume, how many
equal the uninterrupted N-rank run's. Each peer follows its own rules for a resume at M ranks:

* ``zephon``: core ``Loader([docs], [Decode(), Batch(1)], canonical_replicas=16, global_batch_size=16,
  dp_degree=N, dp_rank=r)``; ``merge_states`` of the N rank states, restored by each of the M ranks.
* ``distributed_sampler``: ``torch.utils.data.DistributedSampler(num_replicas, rank, shuffle=True,
  seed=0)``; on resume at M ranks each rank skips its first ``k * G / M`` indices (what
  ``accelerate.skip_first_batches`` and Megatron-style consumed-samples counters do).
* ``grain``: ``grain.experimental.ElasticIterator(MapDataset.shuffle, global_batch_size=G,
  ShardOptions(r, N))``: Grain's elastic API (its state restores at another shard count; it refuses
  many-to-one transforms such as packing).
* ``energon``: ``get_savable_loader`` per rank (``num_workers=2``), ``save_state_rank()`` per rank,
  ``energon checkpoint redist --new-world-size M`` (Energon's tool: the worker slices are kept, so a
  rank gets ``N * 2 / M`` workers), each rank restores its redistributed state.
* ``streaming``: Mosaic ``StreamingDataset(local=<mds>, batch_size=G/N, shuffle=True,
  num_canonical_nodes=8)``, one process per rank (``RANK``, ``WORLD_SIZE``,
  one node, ``LOCAL_WORLD_SIZE`` = ranks, launched together); rank 0's ``state_dict(k * G, True)`` (global)
  is loaded by every rank of the M-rank run.
"""
from __future__ import annotations

import glob
import hashlib
import json
import os
import subprocess
import sys
import tempfile

G = 16


def _key(text: str) -> str:
    return hashlib.sha1(text.encode("utf-8")).hexdigest()[:12]


def _count(ref, resumed, k):
    return sum(1 for a, b in zip(ref[k:], resumed) if a == b)


# ------------------------------------------------------------------------------ zephon

def _zephon(m, N, Ms, k, H):
    from zephon import merge_states
    from zephon.engine import Loader
    from zephon.formats import open_dataset
    from zephon.ops import Batch, Decode

    ds = [open_dataset([f for fs in m["jsonl"] for f in fs], name="docs")]

    def rank_loader(n, r):
        return Loader(ds, [Decode(), Batch(1)], canonical_replicas=16, global_batch_size=G, dp_degree=n, dp_rank=r,
                      chunk_size=64, runner="inline")

    def run(n, steps, state=None):
        per_rank, states = [], []
        for r in range(n):
            L = rank_loader(n, r)
            if state is not None:
                L.restore(state)
            it = iter(L)
            rows = []
            for _ in range(steps):
                rows.append([_key(t) for _ in range(len(L.lanes)) for t in next(it)["text"]])
            states.append(L.checkpoint())
            L.close()
            per_rank.append(rows)
        glob_ = [sorted(x for r in range(n) for x in per_rank[r][t]) for t in range(steps)]
        return glob_, states

    ref, _ = run(N, k + H)
    _, states = run(N, k)
    merged = merge_states(states)
    return {M: _count(ref, run(M, H, merged)[0], k) for M in Ms}


# ------------------------------------------------------------------------------ DistributedSampler

def _distributed_sampler(m, N, Ms, k, H):
    from torch.utils.data import DistributedSampler

    n = m["docs"]

    class Sized:
        def __len__(self):
            return n

    def run(world, start, steps):
        b = G // world
        ranks = [list(DistributedSampler(Sized(), num_replicas=world, rank=r, shuffle=True, seed=0))
                 for r in range(world)]
        return [sorted(i for r in range(world) for i in ranks[r][(start + t) * b:(start + t + 1) * b])
                for t in range(steps)]

    ref = run(N, 0, k + H)
    return {M: _count(ref, run(M, k, H), k) for M in Ms}


# ------------------------------------------------------------------------------ Grain

def _grain(m, N, Ms, k, H):
    import grain
    import numpy as np
    from grain.experimental import ElasticIterator
    from grain.sharding import ShardOptions

    ds = grain.MapDataset.range(m["docs"]).shuffle(seed=0)

    def run(world, steps, state=None):
        its = [ElasticIterator(ds, G, ShardOptions(r, world, drop_remainder=True)) for r in range(world)]
        if state is not None:
            for it in its:
                it.set_state(state)
        out = [sorted(np.concatenate([np.asarray(next(it)) for it in its]).tolist()) for _ in range(steps)]
        return out, its[0].get_state()

    ref, _ = run(N, k + H)
    _, st = run(N, k)
    return {M: _count(ref, run(M, H, json.loads(json.dumps(st)))[0], k) for M in Ms}


# ------------------------------------------------------------------------------ Energon

def _energon(m, N, Ms, k, H):
    import megatron.energon as me
    import torch

    W = 2

    def loader(world, r, nw):
        wc = me.WorkerConfig(rank=r, world_size=world, num_workers=nw)
        ds = me.get_train_dataset(m["wds"], worker_config=wc, batch_size=G // world, shuffle_buffer_size=100,
                                  max_samples_per_sequence=100)
        return me.get_savable_loader(ds, worker_config=wc)

    def run(world, nw, steps, states=None):
        per_rank, saved = [], []
        for r in range(world):
            L = loader(world, r, nw)
            if states is not None:
                L.restore_state_rank(states[r])
            it = iter(L)
            per_rank.append([[_key(t) for t in next(it).text] for _ in range(steps)])
            saved.append(L.save_state_rank())
        return [sorted(x for r in range(world) for x in per_rank[r][t]) for t in range(steps)], saved

    ref, _ = run(N, W, k + H)
    _, saved = run(N, W, k)
    out = {}
    with tempfile.TemporaryDirectory() as d:
        files = []
        for r, st in enumerate(saved):
            files.append(os.path.join(d, f"state_rank{r}.pt"))
            torch.save(st, files[-1])
        exe = os.path.join(os.path.dirname(sys.executable), "energon")
        for M in Ms:
            od = os.path.join(d, f"M{M}")
            os.makedirs(od)
            p = subprocess.run([exe, "checkpoint", "redist", "--new-world-size", str(M), *files, od],
                               capture_output=True, text=True)
            if p.returncode:
                raise RuntimeError(f"energon checkpoint redist: {(p.stderr or p.stdout)[-600:]}")
            new = sorted(glob.glob(os.path.join(od, "*")), key=lambda p: int("".join(c for c in os.path.basename(p)
                                                                                  if c.isdigit()) or 0))
            states = [torch.load(p, weights_only=False) for p in new]
            try:
                out[M] = _count(ref, run(M, N * W // M, H, states)[0], k)
            except ValueError as e:  # Energon refuses the restore (e.g. a larger micro batch per rank)
                out[M] = {"refused": str(e)[:200]}
    return out


# ------------------------------------------------------------------------------ Streaming (one process per rank)

def child_streaming_rank(cfg) -> dict:
    from streaming import StreamingDataset

    world, steps = cfg["world"], cfg["steps"]
    b = G // world
    ds = StreamingDataset(local=cfg["mds"], batch_size=b, shuffle=True, shuffle_seed=17, num_canonical_nodes=8)
    if cfg.get("state"):
        ds.load_state_dict(cfg["state"])
    out, cur = [], []
    state = None
    for s in ds:
        cur.append(_key(s["text"]))
        if len(cur) == b:
            out.append(cur)
            cur = []
            if cfg.get("save_at") and len(out) == cfg["save_at"]:
                state = ds.state_dict(cfg["save_at"] * G, True)
            if len(out) == steps:
                break
    return {"rows": out, "state": state}


def _streaming(m, N, Ms, k, H):
    from .common import run_child

    def run(world, steps, state=None, save_at=None):
        per_rank, st = [], None
        import socket
        from concurrent.futures import ThreadPoolExecutor

        with socket.socket() as sock:  # a free port for the ranks' gloo rendezvous
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]

        def one(r):
            env = {"RANK": str(r), "WORLD_SIZE": str(world), "LOCAL_RANK": str(r), "LOCAL_WORLD_SIZE": str(world),
                   "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}
            return run_child("divergence.streaming_rank", {"mds": m["mds"], "world": world, "steps": steps,
                                                           "state": state, "save_at": save_at}, env_extra=env,
                             timeout=300)

        with ThreadPoolExecutor(world) as ex:  # ranks run concurrently: Mosaic synchronises them
            results = list(ex.map(one, range(world)))
        for r, res in enumerate(results):
            if not res or "error" in res:
                raise RuntimeError(f"streaming rank {r}/{world}: {res and res.get('error')}: "
                                   f"{res and res.get('stderr', '')[-800:]}")
            per_rank.append(res["rows"])
            st = st or res["state"]
        return [sorted(x for r in range(world) for x in per_rank[r][t]) for t in range(steps)], st

    from streaming.base.util import clean_stale_shared_memory

    clean_stale_shared_memory()
    ref, st = run(N, k + H, save_at=k)
    return {M: _count(ref, run(M, H, st)[0], k) for M in Ms}


PEERS = {"zephon": _zephon, "distributed_sampler": _distributed_sampler, "grain": _grain, "energon": _energon,
         "streaming": _streaming}


def child_run(cfg) -> dict:
    N, Ms, k, H = cfg["N"], cfg["Ms"], cfg["k"], cfg["H"]
    equal = PEERS[cfg["impl"]](cfg["manifest"], N, Ms, k, H)
    return {"equal": {str(M): v for M, v in equal.items()}, "H": H, "k": k, "N": N}
