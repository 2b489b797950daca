"""Comparison 1 (tokenize + pack to 2048 + batch, from JSONL or Parquet) and 6 (Zephon lanes scaling).

Children (one configuration each, in its own process):

* ``zephon``: ``Loader([source, docstrings], [Decode, Tokenize(eos, max_length), Pack(best_fit),
  Batch(8)], weights = sizes, exhaustion="stop")`` on a runner (inline / threads / processes) built once.
* ``grain``: Google Grain's documented pipeline: ``MapDataset.source(random-access JSONL/Parquet
  source).shuffle(seed)`` -> tokenize (per document ``map``, or per batch of ``unit`` documents with
  ``encode_batch`` then unbatched) -> ``to_iter_dataset(ReadOptions(num_threads))`` ->
  ``experimental.BestFitPackIterDataset`` -> ``batch(8)`` -> ``mp_prefetch(num_workers)``.
* ``torch``: ``torch.utils.data.DataLoader(IterableDataset, batch_size=8, num_workers, persistent_workers)``;
  each worker reads its share of a seeded permutation of the documents, ``encode_batch`` per ``unit``
  documents, concatenates with EOS and splits into 2048-token rows (the usual ``group_texts``).

Each child runs one full untimed warm-up pass, then a timed pass; tokens/s = tokens of the timed pass /
its wall time (first-batch latency included). Worker start-up is outside the timed pass for every peer:
Zephon's runner is built once for both passes, torch's DataLoader has ``persistent_workers=True``,
and Grain (whose ``mp_prefetch`` starts processes per iterator) runs warm-up and timed pass on one
iterator over the repeated dataset. Tokens are real
(non-padding) tokens. Same tokenizer (the corpus' local BPE, ``tokenizer.json``) everywhere.
"""
from __future__ import annotations

import json
import os
import time

import numpy as np

from ..common import RssWatch, Timer

SEQ = 2048


# ------------------------------------------------------------------------------ shared readers

def jsonl_offsets(path: str) -> np.ndarray:
    offs, pos = [], 0
    with open(path, "rb") as fh:
        for line in fh:
            if line.strip():
                offs.append(pos)
            pos += len(line)
    offs.append(pos)
    return np.asarray(offs, dtype=np.int64)


class _FilesSource:
    """Rows of several files as one random-access sequence: ``cum`` (row count prefix sums) locates a row;
    ``_open`` (per-process handles, opened lazily) is dropped when pickled, so each worker opens its own."""

    cum: np.ndarray
    _open = None

    def __len__(self):
        return int(self.cum[-1])

    def __getstate__(self):
        d = dict(self.__dict__)
        d["_open"] = None
        return d

    def _locate(self, i) -> tuple[int, int]:
        """``(file index, row in that file)`` of row ``i``."""
        i = int(i)
        f = int(np.searchsorted(self.cum, i, side="right")) - 1
        return f, i - int(self.cum[f])


class JsonlSource(_FilesSource):
    """Random-access text source over JSONL files (line offsets; ``os.pread`` + ``json.loads``): what a
    Grain user writes for JSONL (Grain ships ArrayRecord/Parquet readers, no JSONL one). Picklable."""

    def __init__(self, files: list[str]):
        self.files = list(files)
        self.offsets = [jsonl_offsets(f) for f in self.files]
        self.cum = np.cumsum([0] + [len(o) - 1 for o in self.offsets])

    def __getitem__(self, i):
        f, j = self._locate(i)
        if self._open is None:
            self._open = [os.open(p, os.O_RDONLY) for p in self.files]
        o = self.offsets[f]
        return json.loads(os.pread(self._open[f], int(o[j + 1] - o[j]), int(o[j])))["text"]


class ParquetSource(_FilesSource):
    """Random-access text source over Parquet files: the ``text`` column read once per process
    (pyarrow), then indexed. Picklable (reads lazily in each worker)."""

    def __init__(self, files: list[str]):
        import pyarrow.parquet as pq

        self.files = list(files)
        self.cum = np.cumsum([0] + [pq.ParquetFile(f).metadata.num_rows for f in self.files])

    def __getitem__(self, i):
        import pyarrow.parquet as pq

        f, j = self._locate(i)
        if self._open is None:
            self._open = [pq.read_table(p, columns=["text"]).column("text") for p in self.files]
        return self._open[f][j].as_py()


def text_source(fmt: str, files: list[str]):
    return JsonlSource(files) if fmt == "jsonl" else ParquetSource(files)


_TOK = {}


def tokenizer(path: str):
    if path not in _TOK:
        from tokenizers import Tokenizer

        _TOK[path] = Tokenizer.from_file(path)
    return _TOK[path]


def encode_many(tok_path: str, texts, eos: int, max_length: int = SEQ) -> list[np.ndarray]:
    """``encode_batch``, EOS appended; a document longer than ``max_length`` tokens is split into pieces
    of at most ``max_length`` (nothing dropped: what Zephon's ``Tokenize(max_length=...)`` does)."""
    tok = tokenizer(tok_path)
    enc = getattr(tok, "encode_batch_fast", tok.encode_batch)
    out = []
    for e in enc(list(texts), add_special_tokens=False):
        ids = e.ids
        ids.append(eos)
        a = np.asarray(ids, dtype=np.int32)
        out.extend(a[k:k + max_length] for k in range(0, a.size, max_length))
    return out


# ------------------------------------------------------------------------------ measuring a pass

def timed_pass(batches, count):
    """Iterate ``batches``; returns dict(tokens, rows, first_batch s, steady seconds, rate)."""
    t0 = time.perf_counter()
    tokens = rows = 0
    first_t = None
    first_tokens = 0
    for b in batches:
        n, r = count(b)
        tokens += n
        rows += r
        if first_t is None:
            first_t, first_tokens = time.perf_counter(), n
    end = time.perf_counter()
    steady = end - (first_t or end)
    return {"tokens": tokens, "rows": rows, "first_batch": (first_t - t0) if first_t else None,
            "seconds": end - t0, "steady_seconds": steady, "rate": tokens / (end - t0) if end > t0 else None,
            "steady_rate": (tokens - first_tokens) / steady if steady > 0 else None}


def _measure(make_iter, count, warmup: bool = True):
    """Warm-up pass (untimed), then the timed pass under an RSS watch and CPU timer."""
    with RssWatch() as watch:
        t0 = time.perf_counter()
        if warmup:
            w = timed_pass(make_iter(), count)
        startup = (w["first_batch"] if warmup else None)
        with Timer() as t:
            res = timed_pass(make_iter(), count)
        res["cpu"] = t.cpu
        res["warmup_seconds"] = time.perf_counter() - t0 - t.seconds
    res["startup"] = startup
    res.update(watch.result())
    return res


# ------------------------------------------------------------------------------ zephon

def zephon_loader(cfg, runner):
    from zephon.engine import Loader
    from zephon.formats import open_dataset
    from zephon.ops import Batch, Decode, Pack, Tokenize

    m = cfg["manifest"]
    files = m[cfg["format"]]
    datasets = [open_dataset(fs, name=n) for fs, n in zip(files, m["names"])]
    ops = [Decode(), Tokenize(m["tokenizer"], eos_id="<eos>", max_length=SEQ), Pack(SEQ, method="best_fit"),
           Batch(cfg.get("micro_batch", 8), drop_last=False)]
    lanes = cfg.get("lanes", 8)
    return Loader(datasets, ops, weights=[ds.num_samples for ds in datasets], seed=0, canonical_replicas=lanes,
                  chunk_size=cfg.get("chunk_size", 1024), exhaustion="stop", runner=runner,
                  num_workers=cfg.get("workers", 2), unit_size=cfg.get("unit", 256))


def child_zephon(cfg) -> dict:
    from zephon.engine import make_runner

    probe = zephon_loader(cfg, "inline")
    runner = make_runner(cfg["runner"], probe.stage, cfg.get("workers", 2))

    def count(mb):
        return int(mb["attention_mask"].sum(dtype=np.int64)), mb["attention_mask"].shape[0]

    prof = None
    if cfg.get("profile"):
        import cProfile

        prof = cProfile.Profile()
    res = _measure(lambda: _profiled(iter(zephon_loader(cfg, runner)), prof), count)
    if prof is not None:
        import io
        import pstats

        s = io.StringIO()
        pstats.Stats(prof, stream=s).sort_stats("cumulative").print_stats(cfg["profile"])
        res["profile"] = s.getvalue()[-12000:]
    runner.close()
    res["lanes"] = cfg.get("lanes", 8)
    return res


def _profiled(it, prof):
    if prof is None:
        yield from it
        return
    prof.enable()
    try:
        yield from it
    finally:
        prof.disable()


# ------------------------------------------------------------------------------ grain

class _EncodeDoc:
    """Grain map: one document -> its pieces [{"inputs": int32 ids + EOS}] (``Tokenizer.encode``)."""

    def __init__(self, tok_path, eos):
        self.tok_path, self.eos = tok_path, eos

    def __call__(self, text):
        ids = tokenizer(self.tok_path).encode(text, add_special_tokens=False).ids
        ids.append(self.eos)
        a = np.asarray(ids, dtype=np.int32)
        return [{"inputs": a[k:k + SEQ]} for k in range(0, a.size, SEQ)]


class _EncodeBatch:
    """Grain map over a batch of documents: ``encode_batch`` once, a list of {"inputs": ids}."""

    def __init__(self, tok_path, eos):
        self.tok_path, self.eos = tok_path, eos

    def __call__(self, texts):
        return [{"inputs": a} for a in encode_many(self.tok_path, list(texts), self.eos)]


def _unbatch_cls():
    from grain.experimental import FlatMapTransform

    class Unbatch(FlatMapTransform):
        def __init__(self, fan_out):
            self.max_fan_out = fan_out

        def flat_map(self, element):
            return element

    return Unbatch


def _Unbatch(fan_out):
    return _unbatch_cls()(fan_out)


def grain_dataset(cfg):
    import grain

    m = cfg["manifest"]
    files = [f for fs in m[cfg["format"]] for f in fs]
    src = text_source(cfg["format"], files)
    eos = tokenizer(m["tokenizer"]).token_to_id("<eos>")
    from grain.experimental import FlatMapIterDataset

    ds = grain.MapDataset.source(src).shuffle(seed=0)
    if cfg.get("repeat"):
        ds = ds.repeat()
    if cfg["encode"] == "batch":
        unit = cfg.get("unit", 256)
        ds = ds.batch(unit, batch_fn=list).map(_EncodeBatch(m["tokenizer"], eos))
        it = ds.to_iter_dataset(grain.ReadOptions(num_threads=cfg.get("read_threads", 2), prefetch_buffer_size=4))
        it = FlatMapIterDataset(it, _Unbatch(unit * 8))
    else:
        ds = ds.map(_EncodeDoc(m["tokenizer"], eos))
        it = ds.to_iter_dataset(grain.ReadOptions(num_threads=cfg.get("read_threads", 2),
                                                  prefetch_buffer_size=cfg.get("read_buffer", 256)))
        it = FlatMapIterDataset(it, _Unbatch(512))
    it = grain.experimental.BestFitPackIterDataset(it, length_struct={"inputs": SEQ},
                                                   num_packing_bins=cfg.get("bins", 8), shuffle_bins=False)
    it = it.batch(cfg.get("micro_batch", 8), drop_remainder=False)
    if cfg.get("workers", 2) > 0:
        it = it.mp_prefetch(grain.MultiprocessingOptions(num_workers=cfg.get("workers", 2),
                                                         per_worker_buffer_size=cfg.get("worker_buffer", 2)))
    return it


def child_grain(cfg) -> dict:
    os.environ["TOKENIZERS_PARALLELISM"] = "true" if cfg.get("tok_parallel", False) else "false"
    ds = grain_dataset(cfg)

    def count(b):
        seg = b["inputs_segment_ids"]
        return int(np.count_nonzero(seg)), seg.shape[0]

    if cfg.get("workers", 2) == 0:
        return _measure(lambda: iter(ds), count)
    # mp_prefetch starts its worker processes with each new iterator: count one pass's batches, then
    # on ONE iterator over the repeated dataset warm up for that many batches and time the next as many
    # (so process start-up stays out of the timed pass, as for the other loaders' persistent workers).
    n_batches = sum(1 for _ in iter(ds))
    it = iter(grain_dataset({**cfg, "repeat": True}))
    with RssWatch() as watch:
        t0 = time.perf_counter()
        warm = timed_pass(_take(it, n_batches), count)
        with Timer() as t:
            res = timed_pass(_take(it, n_batches), count)
        res["cpu"] = t.cpu
        res["warmup_seconds"] = time.perf_counter() - t0 - t.seconds
    res["startup"] = warm["first_batch"]
    res.update(watch.result())
    return res


def _take(it, n):
    for _ in range(n):
        yield next(it)


# ------------------------------------------------------------------------------ torch DataLoader

class TorchPackDataset:  # defined as torch IterableDataset in child_torch (import torch lazily)
    pass


def _torch_dataset_cls():
    import torch

    class PackIterable(torch.utils.data.IterableDataset):
        """Each worker: its share of a seeded permutation of all documents, read, ``encode_batch`` per
        ``unit`` documents, EOS appended, concatenated and split into ``SEQ``-token rows (last row padded)."""

        def __init__(self, src, tok_path, unit):
            self.src = src  # random-access texts: a file source, or a list already in memory
            self.tok_path, self.unit = tok_path, unit

        def __iter__(self):
            info = torch.utils.data.get_worker_info()
            w, nw = (info.id, info.num_workers) if info else (0, 1)
            order = np.random.default_rng(0).permutation(len(self.src))[w::nw]
            eos = tokenizer(self.tok_path).token_to_id("<eos>")
            buf = np.zeros(0, dtype=np.int32)
            for b in range(0, len(order), self.unit):
                texts = [self.src[i] for i in order[b:b + self.unit]]
                buf = np.concatenate([buf] + encode_many(self.tok_path, texts, eos))
                full = buf.size // SEQ
                for r in range(full):
                    yield torch.from_numpy(buf[r * SEQ:(r + 1) * SEQ].copy()), SEQ
                buf = buf[full * SEQ:]
            if buf.size:
                row = np.zeros(SEQ, dtype=np.int32)
                row[:buf.size] = buf
                yield torch.from_numpy(row), int(buf.size)

    return PackIterable


def torch_loader(cfg):
    """The plain torch baseline: ``DataLoader(PackIterable, batch_size=micro_batch, num_workers=workers)`` over the
    manifest's ``format`` files (or ``cfg["texts"]`` in memory); one item is ``(ids [micro_batch, SEQ] int32,
    real tokens per row [micro_batch])``."""
    import torch

    os.environ.setdefault("TOKENIZERS_PARALLELISM", "true")
    m = cfg["manifest"]
    src = cfg.get("texts") or text_source(cfg["format"], [f for fs in m[cfg["format"]] for f in fs])
    ds = _torch_dataset_cls()(src, m["tokenizer"], cfg.get("unit", 256))
    nw = cfg.get("workers", 2)
    return torch.utils.data.DataLoader(ds, batch_size=cfg.get("micro_batch", 8), num_workers=nw,
                                       persistent_workers=nw > 0, prefetch_factor=4 if nw else None)


def child_torch(cfg) -> dict:
    dl = torch_loader(cfg)

    def count(b):
        return int(b[1].sum()), b[0].shape[0]

    return _measure(lambda: iter(dl), count)
