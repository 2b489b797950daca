"""Cold time to the first batch, Zephon beside its peers, each in a fresh process (issue 29).

    python -m benchmarks --only first-batch-peers [--repeats 3] [--quick] [--workdir DIR]

Text (the throughput benchmark's corpus, JSONL, its BPE): tokenize + pack(2048) + batch(8) through Zephon (8 lanes,
2 workers; best-fit and concat packing; threads and processes), Google Grain (``MapDataset`` + batch encode +
``BestFitPackIterDataset``, with 2 read threads, and with ``mp_prefetch`` over 2 processes) and a torch DataLoader (2
workers, concat-and-split); the pipelines of ``benchmarks/throughput/peers.py``. Samples: Mosaic Streaming's MDS
(``StreamingDataset`` + ``StreamingDataLoader``, 2 workers, batch 8) beside ``zephon_streaming``, and Energon's
WebDataset (``get_train_dataset`` + ``get_loader``, 2 workers, batch 8) beside ``zephon_energon``.

Each child imports its libraries first, then times from building the loader (worker start-up included) to its first
batch of 8 rows (**1st batch s**) and to its first 64 rows (**64 rows s**: a Zephon global step over 8 lanes of 8
rows). Rounds are interleaved (every configuration once per round, order rotated). Prints only.
"""
from __future__ import annotations

import argparse
import os
import statistics
import time

from .common import run_child

SEQ, BATCH, ROWS = 2048, 8, 64


def _zephon_text(cfg):
    from zephon.engine import Loader
    from zephon.formats import open_dataset
    from zephon.ops import Batch, Decode, Pack, Tokenize

    m = cfg["manifest"]
    datasets = [open_dataset(fs, name=n) for fs, n in zip(m["jsonl"], m["names"])]
    split = None if cfg["method"] == "concat" else SEQ  # concat cuts whole documents itself
    ops = [Decode(), Tokenize(m["tokenizer"], eos_id="<eos>", max_length=split), Pack(SEQ, method=cfg["method"]),
           Batch(BATCH, drop_last=False)]
    return Loader(datasets, ops, weights=[ds.num_samples for ds in datasets], seed=0, canonical_replicas=8,
                  chunk_size=1024, exhaustion="stop", runner=cfg["runner"], num_workers=2, unit_size=256)


def _rows(b) -> int:
    """Rows (or samples) in one batch of any of the loaders measured."""
    if isinstance(b, dict):
        for k in ("attention_mask", "inputs_segment_ids", "text"):
            if k in b:
                return len(b[k])
    if isinstance(b, (list, tuple)):
        return len(b[0])
    if hasattr(b, "__key__"):
        return len(b.__key__)
    return len(b)


def _build(cfg):
    """The loader of ``cfg["impl"]``, ready to iterate."""
    impl, m = cfg["impl"], cfg["manifest"]
    if impl == "zephon":
        return _zephon_text(cfg)
    if impl == "grain":
        from .throughput.peers import grain_dataset

        return grain_dataset({"manifest": m, "format": "jsonl", "encode": "batch", "workers": cfg["workers"]})
    if impl == "torch":
        import torch

        from .throughput.peers import _torch_dataset_cls, text_source

        src = text_source("jsonl", [f for fs in m["jsonl"] for f in fs])
        return torch.utils.data.DataLoader(_torch_dataset_cls()(src, m["tokenizer"], 256), batch_size=BATCH,
                                           num_workers=2, prefetch_factor=4)
    if impl in ("streaming", "zephon_streaming"):
        if impl == "streaming":
            from streaming import StreamingDataLoader, StreamingDataset
            from streaming.base.util import clean_stale_shared_memory

            clean_stale_shared_memory()
        else:
            from zephon_streaming import StreamingDataLoader, StreamingDataset
        ds = StreamingDataset(local=m["mds"], batch_size=BATCH, shuffle=True, shuffle_seed=17)
        return StreamingDataLoader(ds, batch_size=BATCH, num_workers=2, prefetch_factor=4)
    mod = __import__("megatron.energon", fromlist=["x"]) if impl == "energon" else __import__("zephon_energon")
    wc = mod.WorkerConfig(rank=0, world_size=1, num_workers=2)
    ds = mod.get_train_dataset(m["wds"], worker_config=wc, batch_size=BATCH, shuffle_buffer_size=100,
                               max_samples_per_sequence=100)
    return mod.get_loader(ds, worker_config=wc, prefetch_factor=4)


def _imports(impl: str) -> None:
    """Import what ``impl`` needs before the clock starts (import time is not the loader's)."""
    # zephon imports its modules on first use: name those the loader's build uses (format detection tries each format)
    mods = {"zephon": ["zephon.engine.loader", "zephon.formats.energon", "zephon.formats.mds", "zephon.ops",
                       "tokenizers"], "grain": ["grain", "tokenizers"],
            "torch": ["torch", "tokenizers"], "streaming": ["streaming", "torch"],
            "zephon_streaming": ["zephon_streaming", "torch"], "energon": ["megatron.energon", "torch"],
            "zephon_energon": ["zephon_energon", "torch"]}[impl]
    for name in mods:
        __import__(name)


def child_cold(cfg) -> dict:
    """Seconds from building ``cfg``'s loader to its first batch and to its first ``ROWS`` rows."""
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "true")
    _imports(cfg["impl"])
    t0 = time.perf_counter()
    it = iter(_build(cfg))
    first, rows = None, 0
    while rows < ROWS:
        rows += _rows(next(it))
        if first is None:
            first = time.perf_counter() - t0
    return {"first_batch": first, "rows_s": time.perf_counter() - t0}


TEXT = [("zephon/threads, best_fit", {"impl": "zephon", "runner": "threads", "method": "best_fit"}),
        ("zephon/threads, concat", {"impl": "zephon", "runner": "threads", "method": "concat"}),
        ("zephon/processes, best_fit", {"impl": "zephon", "runner": "processes", "method": "best_fit"}),
        ("zephon/processes, concat", {"impl": "zephon", "runner": "processes", "method": "concat"}),
        ("grain/threads, best-fit", {"impl": "grain", "workers": 0}),
        ("grain/mp2, best-fit", {"impl": "grain", "workers": 2}),
        ("torch DataLoader/2 workers, concat-and-split", {"impl": "torch"})]
MDS = [("streaming.StreamingDataset", {"impl": "streaming"}),
       ("zephon_streaming.StreamingDataset", {"impl": "zephon_streaming"})]
WDS = [("megatron.energon", {"impl": "energon"}), ("zephon_energon", {"impl": "zephon_energon"})]


def main(argv=None) -> int:
    from .prepare import prepare
    from zephon.demo_corpus import default_workdir

    ap = argparse.ArgumentParser(prog="python -m benchmarks --only first-batch-peers", description=__doc__)
    ap.add_argument("--workdir", default=default_workdir())
    ap.add_argument("--quick", action="store_true", help="the quick corpus (one shard per dataset), 1 round")
    ap.add_argument("--repeats", type=int, default=None, help="rounds (default 3; 1 with --quick)")
    args = ap.parse_args(argv)
    manifest = prepare(args.workdir, args.quick, log=lambda *a: None)
    configs = TEXT + MDS + WDS
    rounds = args.repeats or (1 if args.quick else 3)
    results: dict = {name: [] for name, _ in configs}
    print(f"# cold first batch, {rounds} interleaved rounds, load average {os.getloadavg()[0]:.2f}", flush=True)
    for r in range(rounds):
        for name, cfg in configs[r % len(configs):] + configs[:r % len(configs)]:
            res = run_child("first_batch_peers.cold", {**cfg, "manifest": manifest, "name": name})
            results[name].append(res if res and "error" not in res else None)
            if res and "error" not in res:
                print(f"  round {r + 1}/{rounds} {name}: {res['first_batch']:.2f} s, {ROWS} rows {res['rows_s']:.2f} s "
                      f"(load {os.getloadavg()[0]:.2f})", flush=True)
    print("\n| pipeline | loader | 1st batch s median (min-max) | vs fastest peer | 64 rows s median (min-max) | "
          "vs fastest peer |\n|---|---|---|---|---|---|")
    for group, rows in (("text, JSONL", TEXT), ("samples, MDS", MDS), ("samples, Energon WebDataset", WDS)):
        med = {n: {k: statistics.median(x[k] for x in results[n] if x) for k in ("first_batch", "rows_s")}
               for n, _ in rows if any(results[n])}
        peers = [n for n in med if not n.startswith("zephon")]
        best = {k: min((med[n][k] for n in peers), default=None) for k in ("first_batch", "rows_s")}
        for n, _ in rows:
            if n not in med:
                print(f"| {group} | {n} | failed | | | |")
                continue
            cells = []
            for k in ("first_batch", "rows_s"):
                xs = [x[k] for x in results[n] if x]
                cells += [f"{med[n][k]:.2f} ({min(xs):.2f}-{max(xs):.2f})",
                          f"{med[n][k] / best[k]:.2f}" if best[k] else "-"]
            print(f"| {group} | {n} | " + " | ".join(cells) + " |")
    print(f"load average (1 min) at the end: {os.getloadavg()[0]:.2f} on {os.cpu_count()} CPUs")
    return 0
