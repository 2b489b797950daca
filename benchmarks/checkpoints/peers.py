"""Comparison 4: checkpoint size and time to first batch after a restore, at several steps.

One workload for every loader, cheap per step so that step 10,000 is reachable: read documents and
batch 8 of them per step (no tokenization: what is measured is the loader's state, not the pipeline),
shuffled, repeating over the corpus, 2 workers (threads or processes as the loader does it):

* ``zephon``: core ``Loader([docs], [Decode(), Batch(1)], canonical_replicas=8, global_batch_size=8,
  runner="threads", num_workers=2)`` over the JSONL files (a step = one row from each of 8 lanes);
  state = ``json.dumps(loader.checkpoint())``.
* ``grain``: ``MapDataset.source(JSONL source).shuffle(0).repeat().batch(8).to_iter_dataset()
  .mp_prefetch(2 workers)``; state = ``json.dumps(iterator.get_state())``.
* ``torchdata``: ``StatefulDataLoader(map-style JSONL dataset, batch_size=8, num_workers=2,
  sampler=torchdata RandomSampler(num_samples=enough))``; state = ``torch.save(state_dict())``.
* ``energon``: ``get_savable_loader(get_train_dataset(<wds>, batch_size=8, shuffle_buffer_size=100,
  max_samples_per_sequence=100, num_workers=2))``; state = ``torch.save(save_state_rank())``.
* ``streaming``: Mosaic ``StreamingDataset(local=<mds>, batch_size=8, shuffle=True)`` +
  ``StreamingDataLoader(num_workers=2)``; state = ``json.dumps(loader.state_dict())``.

For each step s: the uninterrupted run saves its state after s steps and records a digest of batch
s + 1; a fresh loader restores the state and is timed to its first batch, whose digest is compared
(``exact`` = the resumed stream continues where the saved one stopped). ``cold`` = a fresh loader's
time to its first batch without a state (the best of two, measured after the restores so that no
measurement pays the process's one-time costs).
"""
from __future__ import annotations

import io
import json
import os
import pickle
import time

from ..throughput.peers import JsonlSource
from . import digest


def _torch_bytes(obj) -> int:
    import torch

    b = io.BytesIO()
    torch.save(obj, b)
    return len(b.getvalue())


# ------------------------------------------------------------------------------ the five loaders

class _Peer:
    """One loader under test: ``make()`` a fresh loader, ``steps(loader)`` its batches, ``save(loader)`` ->
    (state, bytes), ``restore(state)`` a fresh loader resumed from ``state`` (``_load``), ``close``."""

    def restore(self, state):
        loader = self.make()
        self._load(loader, state)
        return loader

    def _load(self, loader, state):
        loader.load_state_dict(state)

    def close(self, loader):
        pass


class ZephonCk(_Peer):
    name = "zephon"

    def __init__(self, m):
        from zephon.formats import open_dataset

        self.files = [f for fs in m["jsonl"] for f in fs]
        self.datasets = [open_dataset(self.files, name="docs")]

    def make(self):
        from zephon.engine import Loader
        from zephon.ops import Batch, Decode

        return Loader(self.datasets, [Decode(), Batch(1)], canonical_replicas=8, global_batch_size=8, seed=0,
                      chunk_size=256, runner="threads", num_workers=2)

    def steps(self, loader):
        it = iter(loader)
        while True:
            texts = []
            for _ in range(8):
                mb = next(it)
                texts.extend(mb["text"])
            yield texts

    def save(self, loader):
        s = json.dumps(loader.checkpoint())
        return s, len(s)

    def _load(self, loader, state):
        loader.restore(json.loads(state))

    def close(self, loader):
        loader.close()


class GrainCk(_Peer):
    name = "grain"

    def __init__(self, m):
        self.src = JsonlSource([f for fs in m["jsonl"] for f in fs])

    def make(self):
        import grain

        ds = grain.MapDataset.source(self.src).shuffle(seed=0).repeat().batch(8, batch_fn=list)
        it = ds.to_iter_dataset(grain.ReadOptions(num_threads=2, prefetch_buffer_size=16))
        return iter(it.mp_prefetch(grain.MultiprocessingOptions(num_workers=2, per_worker_buffer_size=2)))

    def steps(self, it):
        for b in it:
            yield b

    def save(self, it):
        st = it.get_state()
        s = json.dumps(st)
        return st, len(s)

    def _load(self, it, state):
        it.set_state(state)

    def close(self, it):
        close = getattr(it, "close", None)
        if close:
            close()


class _MapDocs:
    def __init__(self, src):
        self.src = src

    def __len__(self):
        return len(self.src)

    def __getitem__(self, i):
        return self.src[i]


class TorchdataCk(_Peer):
    name = "torchdata"

    def __init__(self, m, total_steps):
        self.ds = _MapDocs(JsonlSource([f for fs in m["jsonl"] for f in fs]))
        self.n = (total_steps + 4) * 8

    def make(self):
        import torch
        from torchdata.stateful_dataloader import StatefulDataLoader
        from torchdata.stateful_dataloader.sampler import RandomSampler

        g = torch.Generator()
        g.manual_seed(0)
        return StatefulDataLoader(self.ds, batch_size=8, sampler=RandomSampler(self.ds, num_samples=self.n,
                                                                             generator=g),
                                  num_workers=2, collate_fn=list)

    def steps(self, dl):
        for b in dl:
            yield b

    def save(self, dl):
        st = dl.state_dict()
        return st, _torch_bytes(st)



class EnergonCk(_Peer):
    name = "energon"

    def __init__(self, m):
        self.path = m["wds"]

    def make(self):
        import megatron.energon as me

        wc = me.WorkerConfig(rank=0, world_size=1, num_workers=2)
        ds = me.get_train_dataset(self.path, worker_config=wc, batch_size=8, shuffle_buffer_size=100,
                                  max_samples_per_sequence=100)
        return me.get_savable_loader(ds, worker_config=wc)

    def steps(self, loader):
        for b in loader:
            yield b.text

    def save(self, loader):
        st = loader.save_state_rank()
        return st, _torch_bytes(st)

    def _load(self, loader, state):
        loader.restore_state_rank(state)


class StreamingCk(_Peer):
    name = "streaming"

    def __init__(self, m):
        from streaming.base.util import clean_stale_shared_memory

        clean_stale_shared_memory()
        self.path = m["mds"]
        self._n = 0

    def make(self):
        from streaming import StreamingDataLoader, StreamingDataset

        self._n += 1
        ds = StreamingDataset(local=self.path, batch_size=8, shuffle=True, shuffle_seed=17)
        return StreamingDataLoader(ds, batch_size=8, num_workers=2)

    def steps(self, dl):
        while True:  # each iter() is the next epoch
            for b in dl:
                yield b["text"]

    def save(self, dl):
        st = dl.state_dict()
        return st, len(json.dumps(st))



def child_run(cfg) -> dict:
    os.environ["TOKENIZERS_PARALLELISM"] = "false"
    m, steps = cfg["manifest"], sorted(cfg["steps"])
    impl = {"zephon": ZephonCk, "grain": GrainCk, "energon": EnergonCk, "streaming": StreamingCk}.get(cfg["impl"])
    ck = TorchdataCk(m, steps[-1]) if cfg["impl"] == "torchdata" else impl(m)
    # the uninterrupted run, saving at each step and recording batch s + 1
    L = ck.make()
    gen = ck.steps(L)
    saved, done, t0 = {}, 0, time.perf_counter()
    for s in steps:
        while done < s:
            next(gen)
            done += 1
        st, size = ck.save(L)
        if not isinstance(st, str):
            st = pickle.loads(pickle.dumps(st))  # detach from the live loader
        nxt = next(gen)
        done += 1
        saved[s] = (st, size, digest(nxt), time.perf_counter() - t0)
    del gen
    ck.close(L)
    rows = []
    for s in steps:
        st, size, want, run_s = saved[s]
        t0 = time.perf_counter()
        R = ck.restore(st)
        first = next(iter(ck.steps(R)))
        restore = time.perf_counter() - t0
        rows.append({"step": s, "bytes": size, "restore": restore, "exact": digest(first) == want,
                     "run_seconds": run_s})
        ck.close(R)
    # cold start: a fresh loader's first batch without a state, measured last (like the restores, after
    # the process's first loader paid the one-time costs: imports, page cache, lazy initialisation)
    colds = []
    for _ in range(2):
        t0 = time.perf_counter()
        L = ck.make()
        next(iter(ck.steps(L)))
        colds.append(time.perf_counter() - t0)
        ck.close(L)
    return {"cold": min(colds), "rows": rows}
