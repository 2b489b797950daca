"""One configuration of the runners-against-raw table (benchmarks/throughput/vs_raw.py), measured in this process.

``raw`` / ``raw+read`` (the tokenizer baseline, without / with reading the shard files) or a Zephon runner: one
untimed warm-up pass, then one timed pass; the result dict is printed after ``RESULT_TAG`` for the parent.
"""
from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import numpy as np

from benchmarks.common import RESULT_TAG, cpu_seconds, peak_rss_mib


# --------------------------------------------------------------------------------- corpus set-up

def corpus_paths(args) -> tuple[list, str]:
    """Build (once, cached in ``workdir``) the demo corpus and tokenizer. Returns the sources to open
    (one per dataset: a directory, or in quick mode the list of its first shard file) and the
    tokenizer path."""
    from zephon.demo_corpus import build_corpus, build_tokenizer

    dirs = build_corpus(args.workdir)
    tok = build_tokenizer(args.workdir, [dirs["source_jsonl"], dirs["docstrings_jsonl"]], vocab_size=args.vocab_size)
    sources = []
    for name in ("source", "docstrings"):
        d = dirs[f"{name}_{args.format}"]
        if args.quick:  # one shard of four per dataset: about a quarter of the documents
            sources.append([str(sorted(Path(d).glob(f"part-*.{args.format}"))[0])])
        else:
            sources.append(d)
    return sources, tok


def open_datasets(sources):
    from zephon.formats import open_dataset

    return [open_dataset(s, name=n) for s, n in zip(sources, ("source", "docstrings"))]


def make_source(args, datasets):
    from zephon.work import WorkSource

    return WorkSource(datasets, [ds.num_samples for ds in datasets], seed=args.seed,
                      canonical_replicas=args.canonical_replicas, chunk_size=args.chunk_size, exhaustion="stop")


def all_pointers(args, datasets):
    """Every (dataset_id, shard_id, sample_idx) the loader's one pass will read, in global order."""
    src = make_source(args, datasets)
    ptrs = []
    for lane in range(args.canonical_replicas):
        for c in range(src.num_chunks(lane)):
            ch = src.chunk(lane, c)
            ptrs.extend(zip(ch.positions.tolist(), ch.dataset_ids.tolist(), ch.shard_ids.tolist(),
                            ch.sample_idx.tolist()))
    ptrs.sort()
    return [p[1:] for p in ptrs]


def read_texts(datasets, ptrs):
    """Texts at ``ptrs`` via ``Dataset.read`` (grouped per shard), in ``ptrs`` order."""
    by_shard: dict = {}
    for k, (d, s, i) in enumerate(ptrs):
        by_shard.setdefault((d, s), []).append((k, i))
    texts = [None] * len(ptrs)
    for (d, s), items in by_shard.items():
        recs = datasets[d].read(s, [i for _, i in items])
        for (k, _), r in zip(items, recs):
            texts[k] = r["text"]
    return texts


# --------------------------------------------------------------------------------- accounting

def worker_pids() -> list[int]:
    import multiprocessing

    return [p.pid for p in multiprocessing.active_children() if p.pid]


# --------------------------------------------------------------------------------- measurements

def raw_pack(tokenizer, texts, eos: int, batch: int, seq_len: int):
    """The baseline: batch-encode, append EOS, concatenate, split into rows. Returns (rows, tokens)."""
    encode = getattr(tokenizer, "encode_batch_fast", tokenizer.encode_batch)
    parts = []  # one int32 array per batch of documents
    for b in range(0, len(texts), batch):
        ids = []
        for enc in encode(texts[b:b + batch], add_special_tokens=False):
            ids.extend(enc.ids)
            ids.append(eos)
        parts.append(np.array(ids, dtype=np.int32))
    stream = np.concatenate(parts) if parts else np.zeros(0, dtype=np.int32)
    total = int(stream.size)
    full = total // seq_len
    rows = stream[:full * seq_len].reshape(full, seq_len)
    if total % seq_len:
        last = np.zeros((1, seq_len), dtype=np.int32)
        last[0, :total % seq_len] = stream[full * seq_len:]
        rows = np.concatenate([rows, last])
    return rows, total


def read_sequential(sources, fmt: str, ptrs: list):
    """Read every shard file of every dataset front to back (json.loads / pyarrow) and return the
    texts at ``ptrs`` ((dataset_id, shard_id, sample_idx)), in ``ptrs`` order (the same order as the
    raw row, so tokenizer caches behave alike)."""
    import pyarrow.parquet as pq

    found = {}
    for d, src in enumerate(sources):
        files = src if isinstance(src, list) else sorted(str(p) for p in Path(src).glob(f"part-*.{fmt}"))
        for s, f in enumerate(files):
            if fmt == "jsonl":
                with open(f, "rb") as fh:
                    col = [json.loads(line)["text"] for line in fh if line.strip()]
            else:
                col = pq.read_table(f, columns=["text"]).column("text").to_pylist()
            found.update(((d, s, i), t) for i, t in enumerate(col))
    return [found[p] for p in ptrs]


def child_raw(args, with_read: bool) -> dict:
    from tokenizers import Tokenizer

    sources, tok_path = corpus_paths(args)
    datasets = open_datasets(sources)
    ptrs = all_pointers(args, datasets)
    tok = Tokenizer.from_file(tok_path)
    eos = tok.token_to_id("<eos>")
    texts = read_texts(datasets, ptrs)
    raw_pack(tok, texts[:args.unit_size], eos, args.unit_size, args.seq_len)  # warm-up (thread pool, caches)
    c0 = cpu_seconds()
    t0 = time.perf_counter()
    if with_read:
        texts = read_sequential(sources, args.format, ptrs)
    rows, tokens = raw_pack(tok, texts, eos, args.unit_size, args.seq_len)
    elapsed = time.perf_counter() - t0
    cpu = cpu_seconds() - c0
    return {"tokens": tokens, "rows": int(rows.shape[0]), "docs": len(texts), "seconds": elapsed, "cpu": cpu,
            "startup": None, "first_batch": None, "rss_main_mib": peak_rss_mib(), "rss_worker_mib": None}


def child_torch_memory(args) -> dict:
    """The torch DataLoader baseline of comparison 1 (``benchmarks/throughput/peers.py``: ``args.workers`` workers,
    ``encode_batch`` per ``unit_size`` documents, concatenate-and-split), over the texts already in memory."""
    from .peers import child_torch

    sources, tok_path = corpus_paths(args)
    texts = read_texts(open_datasets(sources), all_pointers(args, open_datasets(sources)))
    cfg = {"manifest": {"tokenizer": tok_path}, "texts": texts, "workers": args.workers,
           "micro_batch": args.micro_batch_size, "unit": args.unit_size}
    res = child_torch(cfg)
    res.update(startup=res.get("startup"), rss_worker_mib=None)
    return res


def build_loader(args, datasets, tok_path, runner, method: str = "best_fit"):
    """The measured pipeline on ``runner``; ``method``: Pack's (``best_fit`` or ``concat``)."""
    from zephon.engine import Loader
    from zephon.ops import Batch, Decode, Pack, Shuffle, Tokenize

    # concat cuts whole documents itself (pieces of a split one would be packed as documents of their own)
    ops = [Decode(), Tokenize(tok_path, eos_id="<eos>", max_length=None if method == "concat" else args.seq_len),
           Pack(args.seq_len, method=method)]
    if args.shuffle_buffer:
        ops.append(Shuffle(args.shuffle_buffer, seed=args.seed))
    ops.append(Batch(args.micro_batch_size, drop_last=False))
    return Loader(datasets, ops, weights=[ds.num_samples for ds in datasets], seed=args.seed,
                  canonical_replicas=args.canonical_replicas, chunk_size=args.chunk_size, exhaustion="stop",
                  runner=runner, num_workers=args.workers, unit_size=args.unit_size)


def one_pass(loader):
    """Iterate to exhaustion. Returns (tokens, rows, perf_counter at the first micro-batch, seconds,
    output digest). The digest (SHA-256 over every micro-batch's lane and input_ids, in delivery
    order) shows that all runners deliver the same bytes; its hashing time is left out of the seconds."""
    import hashlib

    digest = hashlib.sha256()
    tokens = rows = 0
    hashing = 0.0
    t0 = time.perf_counter()
    first = None
    for mb in loader:
        if first is None:
            first = time.perf_counter()
        mask = mb["attention_mask"]
        tokens += int(mask.sum(dtype=np.int64))
        rows += mask.shape[0]
        h0 = time.perf_counter()
        digest.update(int(mb["__lane__"]).to_bytes(4, "little"))
        digest.update(np.ascontiguousarray(mb["input_ids"]).tobytes())
        hashing += time.perf_counter() - h0
    return tokens, rows, first, time.perf_counter() - t0 - hashing, digest.hexdigest()[:16]


def child_zephon(args, config: str) -> dict:
    """``config``: a runner name, optionally ``+concat`` (concatenation packing instead of best-fit)."""
    from zephon.engine import make_runner

    runner_name, _, method = config.partition("+")
    method = method or "best_fit"
    sources, tok_path = corpus_paths(args)
    datasets = open_datasets(sources)
    t_start = time.perf_counter()
    # The runner is built once and shared by both passes, so worker start-up (process spawn, stage
    # unpickling, tokenizer load) stays out of the timed pass; it is reported as ``startup``.
    probe = build_loader(args, datasets, tok_path, "inline", method)
    runner = make_runner(runner_name, probe.stage, args.workers)
    _, _, first_warm, _, _ = one_pass(build_loader(args, datasets, tok_path, runner, method))  # warm-up pass
    startup = (first_warm or time.perf_counter()) - t_start
    loader = build_loader(args, datasets, tok_path, runner, method)
    prof = None
    if args.profile:
        import cProfile
        prof = cProfile.Profile()
        prof.enable()
    pids = worker_pids()
    c0 = cpu_seconds()
    t0 = time.perf_counter()
    tokens, rows, first, elapsed, digest = one_pass(loader)
    cpu = cpu_seconds() - c0
    rss_workers = [r for r in (peak_rss_mib(pid) for pid in pids) if r is not None]
    if prof is not None:
        import pstats
        prof.disable()
        for key in ("cumulative", "tottime"):
            pstats.Stats(prof, stream=sys.stderr).sort_stats(key).print_stats(args.profile)
    st = loader.stats()
    stage_s = loader.metrics()["stage_s"]  # where the pass's time went (worker stages summed over workers)
    runner.close()
    return {"tokens": tokens, "rows": rows, "seconds": elapsed, "cpu": cpu, "startup": startup, "digest": digest,
            "first_batch": (first - t0) if first else None, "rss_main_mib": peak_rss_mib(),
            "rss_worker_mib": max(rss_workers) if rss_workers else None, "workers_seen": len(pids),
            "stats": {k: v for k, v in st.items() if k != "skipped_messages"}, "stage_s": stage_s}


def run_child(args) -> None:
    cfg = args.child
    if cfg == "raw":
        res = child_raw(args, with_read=False)
    elif cfg == "raw+read":
        res = child_raw(args, with_read=True)
    elif cfg == "torch":
        res = child_torch_memory(args)
    else:
        res = child_zephon(args, cfg)
    print(RESULT_TAG + json.dumps(res), flush=True)
