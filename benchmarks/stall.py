"""Data stall of a simulated training loop: the fraction of wall time the loop waits on the loader.

    python -m benchmarks --only stall [--quick] [--repeats 3] [--headroom 1.2] [--target NAME=RATE,...]
                                      [--matmul-ms 0] [--steps 16] [--warmup 8] [--lanes 64]
                                      [--configs inline,threads,processes,zephon_torch,zephon_streaming,zephon_energon]
                                      [--tokenizer PATH] [--pipeline demo|vl] [--switch-interval S]

Each configuration runs in a fresh subprocess, rounds interleaved (round r rotates the order by r). In it: the
loader at the demo's settings (``zephon demo``: 64 lanes, chunk 256, Decode + Tokenize + Pack(2048, best_fit) +
Shuffle(32) + Batch(1), weights 0.7/0.3 over the corpus' two datasets, 2 workers, one rank), then

1. warm-up: ``--warmup`` steps consumed as fast as possible (start-up, including filling 64 lanes' packing bins, is
   not a stall of the steady state; it is reported as ``start-up s``);
2. probe: ``--steps`` steps free-running: the loader's throughput R (tokens/s, real tokens; for the core runners the
   tokens their workers produced meanwhile, since what the probe consumes may come from the read-ahead);
3. the loop: ``--warmup`` paced steps not counted (the probe drained the loader's read-ahead, a paced loop never
   does), then ``--steps`` steps of a simulated training step paced at the target ``R / headroom`` tokens/s
   (``--target``: a fixed one). A step takes the next ``per_step`` items (one global step: 64 lane micro-batches
   of one 2048-token row), then "trains"
   for ``tokens of the step / target`` seconds: ``--matmul-ms`` of them in a 1-thread numpy matmul (CPU the step
   takes from the loader, as a host thread launching kernels does), the rest in ``time.sleep`` (a GPU computing,
   CPU-free). Stall = seconds inside ``next()`` during the loop / wall seconds of the loop.

Runners ``inline``/``threads``/``processes`` drive ``zephon.Loader`` directly; ``zephon_torch`` is its
``DataLoader(ZephonIterableDataset, batch_size=None, num_workers=2)`` (a 1-thread runner in each worker; one item is
the rank's step, every lane's rows); on request, ``zephon_torch_threads`` (that runner named explicitly) and
``zephon_torch_inline`` / ``zephon_streaming_inline`` / ``zephon_energon_inline`` (the inline runner in each host
worker, the adapters' default before: no read-ahead but the host's prefetch);
``zephon_streaming_dl`` (on request: a plain torch ``DataLoader(StreamingDataset, batch_size=8, num_workers=2)``, one
worker yielding and collating each step through the step exchange);
``zephon_streaming`` and ``zephon_energon`` (and, on request, ``streaming`` and ``energon``: Mosaic's and Energon's own
loaders on the same data and settings) iterate their host's own format (MDS, WebDataset from
``benchmarks/prepare.py``) as their hosts' users do: text samples, batch 8, 2 workers, a step being 8 batches, and
for Energon a TaskEncoder that tokenizes (``benchmarks/formats.py``); their "tokens" are the tokens Energon's encoder
produced, or for MDS the samples (no tokenizer in Mosaic's loader: the unit is a sample). On request, ``torch`` and
``grain`` are the throughput benchmark's text peers over the same JSONL (a plain torch DataLoader with
concat-and-split, Grain with best-fit packing; 2 workers, a step being one batch of 8 rows of 2048 tokens, as the
core runners' step at ``--lanes 8``). Prints only.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

from .common import RssWatch, markdown_table, run_child
from .stall_vl import VL_CONFIGS, prepare_vl, vl_iterator

CONFIGS = ("inline", "threads", "processes", "zephon_torch", "zephon_streaming", "zephon_energon")
# On request (--configs): zephon_torch with an explicit threads runner (+ dispatcher) per worker (now the default), and
# each adapter with the inline runner per host worker (the default before: no read-ahead but the host's prefetch).
EXTRA = ("zephon_torch_threads", "zephon_torch_inline", "zephon_streaming_inline", "zephon_energon_inline",
         "zephon_streaming_dl")
# On request: the hosts' own loaders on the same data and settings as zephon_streaming and zephon_energon (the stall a
# user of Mosaic Streaming or Energon sees today, through the same torch DataLoader hand-off), and the throughput
# benchmark's two text peers (benchmarks/throughput/peers.py) reading the same JSONL: a plain torch DataLoader with
# concat-and-split and Grain with best-fit packing, 2 workers, a step being one batch of 8 rows of 2048 tokens.
PEERS = ("streaming", "energon", "torch", "grain")
LANES, SEQ = 64, 2048


def _core_loader(cfg, runner):
    from zephon.engine import Loader

    datasets, ops = _pipeline(cfg)
    return Loader(datasets, ops, weights=[0.7, 0.3], seed=0, canonical_replicas=cfg["lanes"], chunk_size=256,
                  runner=runner, num_workers=2)


def _pipeline(cfg):
    """The demo's datasets and operators (see ``zephon.cli_pipeline.build_pipeline``)."""
    from zephon.formats import open_dataset
    from zephon.ops import Batch, Decode, Pack, Shuffle, Tokenize

    datasets = [open_dataset(d, name=n) for d, n in zip(cfg["data"], ("source", "docstrings"))]
    ops = [Decode(), Tokenize(cfg["tokenizer"], eos_id="<eos>", max_length=SEQ), Pack(SEQ, method="best_fit"),
           Shuffle(32, seed=0), Batch(1)]
    return datasets, ops


def _mask_tokens(mb) -> int:
    return int(mb["attention_mask"].sum())


def _iterator(cfg):
    """``(iterator, items per step, count(item) -> tokens, what the count is)`` for ``cfg["config"]``."""
    name = cfg["config"]
    if name.endswith("_inline"):  # the host workers (forked: they inherit this) run the core inline
        import zephon.host.workers

        zephon.host.workers.HOST_WORKER_RUNNER = ("inline", 1)
        name = name[:-len("_inline")]
    if cfg.get("pipeline") == "vl":  # images: benchmarks/stall_vl.py
        return vl_iterator(cfg)
    if name in ("inline", "threads", "processes"):
        cfg["loader"] = _core_loader(cfg, name)  # the probe reads what it produced (see child_run)
        return iter(cfg["loader"]), cfg["lanes"], _mask_tokens, "tokens"
    if name in ("zephon_torch", "zephon_torch_threads"):
        from zephon_torch import DataLoader, ZephonIterableDataset

        datasets, ops = _pipeline(cfg)
        worker = {"worker_runner": "threads", "worker_num_workers": 1} if name.endswith("threads") else {}
        ds = ZephonIterableDataset(datasets, ops, dp_degree=1, dp_rank=0, weights=[0.7, 0.3], seed=0,
                                   canonical_replicas=cfg["lanes"], chunk_size=256, **worker)
        dl = DataLoader(ds, batch_size=None, num_workers=2, prefetch_factor=4)
        # one item is the rank's whole (step, micro-batch): all lanes' rows, so a step is one item
        return iter(dl), 1, _mask_tokens, "tokens"
    m = cfg["manifest"]
    if name == "torch":
        from .throughput.peers import torch_loader

        dl = torch_loader({"manifest": m, "format": "jsonl", "micro_batch": 8})
        return _epochs(dl), 1, lambda b: int(b[1].sum()), "tokens"
    if name == "grain":
        import numpy as np

        from .throughput.peers import grain_dataset

        os.environ["TOKENIZERS_PARALLELISM"] = "false"
        ds = grain_dataset({"manifest": m, "format": "jsonl", "encode": "batch", "repeat": True, "micro_batch": 8})
        return iter(ds), 1, lambda b: int(np.count_nonzero(b["inputs_segment_ids"])), "tokens"
    if name in ("zephon_streaming", "streaming"):
        if name == "streaming":  # Mosaic's own
            from streaming import StreamingDataLoader, StreamingDataset
            from streaming.base.util import clean_stale_shared_memory

            clean_stale_shared_memory()
        else:
            from zephon_streaming import StreamingDataLoader, StreamingDataset

        ds = StreamingDataset(local=m["mds"], batch_size=8, shuffle=True, shuffle_seed=17)
        dl = StreamingDataLoader(ds, batch_size=8, num_workers=2, prefetch_factor=4)
    if name == "zephon_streaming_dl":  # a plain torch DataLoader over it: one worker yields (and collates) a step
        from torch.utils.data import DataLoader
        from zephon_streaming import StreamingDataset

        ds = StreamingDataset(local=m["mds"], batch_size=8, shuffle=True, shuffle_seed=17)
        dl = DataLoader(ds, batch_size=8, num_workers=2, prefetch_factor=4)
    if name in ("zephon_streaming", "streaming", "zephon_streaming_dl"):
        return _epochs(dl), 8, lambda b: len(b["text"]), "samples"
    if name in ("zephon_energon", "energon"):
        if name == "energon":  # Energon's own
            import megatron.energon as mod
        else:
            import zephon_energon as mod

        from .formats import _tokenizing_encoder_cls

        os.environ["TOKENIZERS_PARALLELISM"] = "false"
        wc = mod.WorkerConfig(rank=0, world_size=1, num_workers=2)
        ds = mod.get_train_dataset(m["wds"], worker_config=wc, batch_size=8, shuffle_buffer_size=100,
                                   max_samples_per_sequence=100,
                                   task_encoder=_tokenizing_encoder_cls(mod)(cfg["tokenizer"]))
        return iter(mod.get_loader(ds, worker_config=wc, prefetch_factor=4)), 8, lambda b: int((b != 0).sum()), \
            "tokens"
    raise ValueError(f"unknown stall configuration {name!r}; choose from {CONFIGS + EXTRA + PEERS}")


def _epochs(dl):
    while True:  # Mosaic's loader is one epoch per iteration; a training loop starts the next
        yield from dl


def _matmul(seconds: float, a) -> None:
    """Multiply ``a`` by itself (1 BLAS thread) until ``seconds`` have passed."""
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        a @ a


def run_loop(it, per_step: int, count, steps: int, target: float | None, matmul_s_per_unit: float = 0.0) -> dict:
    """Consume ``steps`` steps of ``per_step`` items; ``target`` (units/s, None: free-running) paces each step to
    ``units of the step / target`` seconds, ``matmul_s_per_unit`` x units of them in a matmul, the rest asleep.
    Returns ``{"units", "wall_s", "wait_s", "max_wait_s", "next_cpu_s"}`` (wait: seconds inside ``next()``;
    next_cpu: the loop thread's own CPU seconds in them, building micro-batches, the rest being waits)."""
    import numpy as np

    a = np.random.default_rng(0).random((256, 256))
    units = 0
    wait = max_wait = cpu = 0.0
    t0 = time.perf_counter()
    for _ in range(steps):
        w0, c0 = time.perf_counter(), time.thread_time()
        n = sum(count(next(it)) for _ in range(per_step))
        w = time.perf_counter() - w0
        cpu += time.thread_time() - c0
        wait += w
        max_wait = max(max_wait, w)
        units += n
        if target:
            step_s = n / target
            mm = min(step_s, n * matmul_s_per_unit)
            _matmul(mm, a)
            time.sleep(max(0.0, step_s - mm))
    return {"units": units, "wall_s": time.perf_counter() - t0, "wait_s": wait, "max_wait_s": max_wait,
            "next_cpu_s": cpu}


def child_run(cfg) -> dict:
    """One configuration: warm-up, probe, paced loop (see the module docstring)."""
    if cfg.get("switch_interval"):  # the training process's own setting (sys.setswitchinterval), as a user sets it
        sys.setswitchinterval(cfg["switch_interval"])
    with RssWatch() as watch:
        t0 = time.perf_counter()
        it, per_step, count, unit = _iterator(cfg)
        run_loop(it, per_step, count, cfg["warmup"], None)
        startup = time.perf_counter() - t0
        # The core loader works ahead (up to read_ahead_steps plus a unit per lane): what the probe consumes may come
        # from that buffer, so its rate is the tokens its workers produced meanwhile (loader.metrics()).
        made = (lambda: sum(d["tokens"] for d in cfg["loader"].metrics()["datasets"].values())) \
            if "loader" in cfg else (lambda: 0)
        made0 = made()
        probe = run_loop(it, per_step, count, cfg["steps"], None)
        rate = ((made() - made0) or probe["units"]) / probe["wall_s"]
        target = rate / cfg["headroom"]
        # --target: the same pace for a configuration and its variants (X, X_inline), whatever their probes say (an
        # adapter's probe counts what it consumed, read-ahead included, so a loader that works ahead looks faster)
        target = (cfg.get("targets") or {}).get(cfg["config"].removesuffix("_inline").removesuffix("_threads"), target)
        # the matmul share of a step: matmul_ms per step of the probe's mean size
        per_unit = cfg["matmul_ms"] / 1000 / (probe["units"] / cfg["steps"])
        # The free-running probe drained the read-ahead, which a loop paced below the loader's rate never does: the
        # first --warmup paced steps let it settle and are not counted (the steady state is what is measured).
        run_loop(it, per_step, count, cfg["warmup"], target, per_unit)
        loop = run_loop(it, per_step, count, cfg["steps"], target, per_unit)
    return {"unit": unit, "per_step": per_step, "startup_s": startup, "loader_rate": rate, "target": target,
            "step_ms": 1000 * (loop["units"] / cfg["steps"]) / target, **loop,
            "stall": loop["wait_s"] / loop["wall_s"],
            "next_cpu": loop["next_cpu_s"] / loop["wall_s"], "load": os.getloadavg()[0], **watch.result()}


def table(results: dict) -> str:
    """Markdown: per configuration, medians (min-max) over the rounds."""
    rows = []
    for name, runs in results.items():
        rs = [r for r in runs if r and "error" not in r]
        if not rs:
            rows.append([name, "failed: " + str((runs[0] or {}).get("error", ""))[:60]] + ["-"] * 7)
            continue

        def mm(key, scale=1.0, spec=".2f"):
            xs = [r[key] * scale for r in rs]
            return f"{statistics.median(xs):{spec}} ({min(xs):{spec}}-{max(xs):{spec}})"
        k, u = (1e-3, "k ") if rs[0]["loader_rate"] >= 1e4 else (1.0, " ")  # images: a few hundred per second
        u += rs[0]["unit"]
        rows.append([name, f"{mm('loader_rate', k, '.0f')}{u}/s", f"{mm('target', k, '.0f')}{u}/s",
                     f"{rs[0]['per_step']} x, {statistics.median(r['step_ms'] for r in rs):.0f} ms",
                     mm("stall", 100, ".1f") + " %", f"{100 * statistics.median(r['next_cpu'] for r in rs):.1f} %",
                     f"{statistics.median(r['max_wait_s'] for r in rs) * 1e3:.0f}",
                     f"{statistics.median(r['startup_s'] for r in rs):.1f}",
                     " ".join(f"{r['load']:.1f}" for r in rs)])
    return markdown_table(["configuration<", "loader rate median (min-max)", "target", "items per step, step time",
                           "stall median (min-max)", "of it next()'s own CPU", "longest wait ms",
                           "start-up s", "load per round"], rows)


def main(argv=None) -> int:
    from zephon.demo_corpus import default_workdir

    ap = argparse.ArgumentParser(prog="python -m benchmarks --only stall", description=__doc__.split("\n\n")[0])
    ap.add_argument("--workdir", default=default_workdir())
    ap.add_argument("--quick", action="store_true", help="1 round, 4 steps, the corpus' first shards")
    ap.add_argument("--repeats", type=int, default=None, help="interleaved rounds (default 3; 1 with --quick)")
    ap.add_argument("--configs", default=",".join(CONFIGS), help="comma-separated, from %(default)s")
    ap.add_argument("--steps", type=int, default=None, help="steps of the probe and of the loop (default 24)")
    ap.add_argument("--warmup", type=int, default=None, help="untimed steps first (default 4)")
    ap.add_argument("--lanes", type=int, default=LANES, help="canonical_replicas (default: the demo's %(default)s)")
    ap.add_argument("--headroom", type=float, default=1.2, help="loader throughput / target (default 1.2)")
    ap.add_argument("--target", default="", help="fixed paces, units/s: name=rate[,name=rate] (name without "
                    "_inline/_threads: a configuration and its variants share it; default: probe rate / headroom)")
    ap.add_argument("--matmul-ms", type=float, default=0.0, help="CPU matmul per step, ms (1 BLAS thread)")
    ap.add_argument("--tokenizer", default=None, help="tokenizer.json (default: the demo's 8192-token BPE)")
    ap.add_argument("--switch-interval", type=float, default=None,
                    help="sys.setswitchinterval in each child, seconds (default: Python's 0.005)")
    ap.add_argument("--pipeline", choices=("demo", "vl"), default="demo",
                    help="demo: text (the default); vl: images + captions, configs from " + ",".join(VL_CONFIGS))
    args = ap.parse_args(argv)
    if args.pipeline == "vl" and args.configs == ",".join(CONFIGS):
        args.configs = ",".join(VL_CONFIGS)
    configs = [c.strip() for c in args.configs.split(",") if c.strip()]
    bad = [c for c in configs if c not in CONFIGS + EXTRA + PEERS]
    if bad:
        ap.error(f"unknown configuration(s) {bad}; choose from {CONFIGS + EXTRA + PEERS}")
    from .prepare import prepare

    m = prepare(args.workdir, quick=args.quick, log=lambda *_: None)
    cfg = {"manifest": m, "data": m["jsonl"], "tokenizer": args.tokenizer or m["tokenizer"],
           "steps": args.steps or (4 if args.quick else 16), "warmup": args.warmup or (1 if args.quick else 8),
           "targets": {k: float(v) for k, v in (t.split("=") for t in args.target.split(",") if t)},
           "headroom": args.headroom, "lanes": args.lanes, "switch_interval": args.switch_interval,
           "matmul_ms": args.matmul_ms, "pipeline": args.pipeline,
           "vl": prepare_vl(args.workdir, args.quick) if args.pipeline == "vl" else None}
    repeats = args.repeats or (1 if args.quick else 3)
    print(f"# stall: {configs}, {args.lanes} lanes, steps={cfg['steps']} (+{cfg['warmup']} warm-up), "
          f"{args.pipeline} pipeline, headroom {args.headroom}, "
          f"matmul {args.matmul_ms} ms/step, switch interval {args.switch_interval or sys.getswitchinterval()} s, "
          f"tokenizer {os.path.basename(cfg['tokenizer'])}, {repeats} rounds, "
          f"nproc={os.cpu_count()}, load {os.getloadavg()[0]:.2f}", flush=True)
    results = {c: [] for c in configs}
    env = {"OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}  # a 1-core matmul
    for rep in range(repeats):
        for c in configs[rep % len(configs):] + configs[:rep % len(configs)]:
            res = run_child("stall.run", {**cfg, "config": c, "name": c}, timeout=600, env_extra=env)
            results[c].append(res)
            if res and "error" not in res:
                print(f"  round {rep + 1}/{repeats} {c:>16}: loader {res['loader_rate'] / 1e3:7.0f}k {res['unit']}/s, "
                      f"stall {100 * res['stall']:5.1f} %, load {res['load']:.2f}", flush=True)
    print()
    print(table(results))
    print(f"load average (1 min) at the end: {os.getloadavg()[0]:.2f} on {os.cpu_count()} CPUs")
    return 0
