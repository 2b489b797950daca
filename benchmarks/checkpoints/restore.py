"""Restore cost against shuffle-buffer size: first batch after a restore vs. a cold start.

For each shuffle-buffer size (10, 1,000, 10,000) and each pipeline, one uninterrupted run saves its state
after ``STEPS`` steps and records batch ``STEPS + 1``; a fresh loader restores the state and is timed to
its first batch (which must equal the recorded one: ``exact``); ``cold`` is a fresh loader's first batch
without a state. Both are the best of two, measured after a warm-up run so that neither pays the process's
one-time costs. Pipelines:

* ``zephon_energon``: ``get_savable_loader(get_train_dataset(<wds>, batch_size=8, shuffle_buffer_size=N,
  max_samples_per_sequence=100, canonical_replicas=8, worker_config=WorkerConfig(0, 1, num_workers=2)))``
  on the benchmark's Energon-prepared WebDataset (``save_state_rank`` / ``restore_state_rank``). Each lane
  has its own buffer of N samples, so a cold start reads 8 x N samples (at the default 64 lanes, 64 x N);
* ``core Shuffle(N)``: ``Loader([docs], [Decode(), Shuffle(N), Batch(1)], canonical_replicas=8,
  global_batch_size=8, runner="threads", num_workers=2)`` on the same documents as JSONL.

    python -m benchmarks --only restore [--quick]

The row "earlier flush_span" runs the largest buffer with the span this adapter used before (4 x the
buffer), for comparison. Prints a table; asserts nothing (timings on shared machines are noisy: read the
ratio).
"""
from __future__ import annotations

import gc
import json
import time

from . import digest
from .peers import _Peer

STEPS = 20
SIZES = (10, 1000, 10000)


class EnergonRun(_Peer):
    """zephon_energon's training loader over the prepared WebDataset."""

    def __init__(self, m, n, flush_span=None):
        self.path, self.n, self.extra = m["wds"], n, {"flush_span": flush_span} if flush_span else {}

    def make(self):
        import zephon_energon as ze

        wc = ze.WorkerConfig(rank=0, world_size=1, num_workers=2)
        ds = ze.get_train_dataset(self.path, worker_config=wc, batch_size=8, shuffle_buffer_size=self.n,
                                  max_samples_per_sequence=100, canonical_replicas=8, **self.extra)
        return ze.get_savable_loader(ds, worker_config=wc)

    def batches(self, loader):
        for b in loader:
            yield list(b.text)

    def save(self, loader):
        return loader.save_state_rank()

    def _load(self, loader, state):
        loader.restore_state_rank(state)

    def close(self, loader):
        loader._stop()  # shut the DataLoader workers down now, not inside the next measurement
        gc.collect()


class CoreRun(_Peer):
    """The core Loader with a shuffle buffer of ``n`` documents."""

    def __init__(self, m, n, **_):
        from zephon import open_dataset

        self.datasets = [open_dataset([f for fs in m["jsonl"] for f in fs], name="docs")]
        self.n = n

    def make(self):
        from zephon import Batch, Decode, Loader, Shuffle

        return Loader(self.datasets, [Decode(), Shuffle(self.n), Batch(1)], canonical_replicas=8,
                      global_batch_size=8, runner="threads", num_workers=2)

    def batches(self, loader):
        it = iter(loader)
        while True:
            yield [t for _ in range(8) for t in next(it)["text"]]

    def save(self, loader):
        return json.loads(json.dumps(loader.checkpoint()))

    def _load(self, loader, state):
        loader.restore(state)

    def close(self, loader):
        loader.close()


def _first(run, loader) -> tuple[float, str]:
    t0 = time.perf_counter()
    batch = next(iter(run.batches(loader)))
    return time.perf_counter() - t0, digest(batch)


def measure(run) -> dict:
    """Save after ``STEPS`` steps, then time restores and cold starts (best of two each)."""
    loader = run.make()
    it = run.batches(loader)
    for _ in range(STEPS):
        next(it)
    state = run.save(loader)
    want = digest(next(it))
    run.close(loader)
    restore, cold, exact = [], [], True
    for _ in range(2):
        t0 = time.perf_counter()
        fresh = run.restore(state)
        _, got = _first(run, fresh)
        restore.append(time.perf_counter() - t0)
        exact = exact and got == want
        run.close(fresh)
        t0 = time.perf_counter()
        fresh = run.make()
        _first(run, fresh)
        cold.append(time.perf_counter() - t0)
        run.close(fresh)
    return {"restore s": round(min(restore), 2), "cold s": round(min(cold), 2),
            "restore / cold": round(min(restore) / min(cold), 2), "exact": exact}


def run_all(workdir: str, quick: bool, log=print) -> list[dict]:
    from ..prepare import prepare

    m = prepare(workdir, quick, log=log)
    rows = []
    runs = [("zephon_energon shuffle_buffer_size", EnergonRun, n, {}) for n in SIZES]
    runs.append(("zephon_energon, earlier flush_span 4 x buffer", EnergonRun, SIZES[-1],
                 {"flush_span": 4 * SIZES[-1]}))
    runs += [("core Shuffle", CoreRun, n, {}) for n in SIZES]
    for name, cls, n, kw in runs:
        log(f"restore: {name} {n}")
        measure(cls(m, n, **kw))  # warm-up: imports, page cache, worker start paths
        rows.append(dict({"pipeline": name, "buffer": n}, **measure(cls(m, n, **kw))))
    return rows


def table(rows: list[dict]) -> str:
    cols = ["pipeline", "buffer", "restore s", "cold s", "restore / cold", "exact"]
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    lines += ["| " + " | ".join(str(r[c]) for c in cols) + " |" for r in rows]
    return "\n".join(lines)


def main(workdir: str, quick: bool) -> str:
    out = table(run_all(workdir, quick))
    print(out)
    return out
