"""Comparisons 2 (MDS: ``zephon_streaming`` vs ``streaming``) and 3 (Energon: ``zephon_energon`` vs
``megatron.energon``), each on its host's own format, the same shards, the same worker count.

* MDS: ``StreamingDataset(local=<mds>, batch_size=8, shuffle=True)`` iterated by a DataLoader with
  ``num_workers`` workers: Mosaic's ``streaming.StreamingDataLoader`` for Mosaic, our recommended
  ``zephon_streaming.StreamingDataLoader`` for Zephon. One untimed warm-up epoch, then one timed epoch.
* Energon: ``get_train_dataset(<wds>, worker_config=WorkerConfig(rank=0, world_size=1,
  num_workers=W), batch_size=8, shuffle_buffer_size=100, max_samples_per_sequence=100,
  task_encoder=...)`` + ``get_loader``; the stream repeats, so a quarter-pass of batches warms up and
  the next full pass worth of batches is timed. With ``task_encoder="tokenize"``: a ``TaskEncoder``
  whose ``encode_sample`` tokenizes ``TextSample.text`` (``Tokenizer.encode``, truncation to 2048) and
  whose ``batch`` pads into one int64 tensor (the usual Energon text recipe).

samples/s = samples of the timed part / its wall time (for MDS, each epoch is a new DataLoader iteration:
worker start-up is inside the epoch for both libraries alike).
"""
from __future__ import annotations

import os
import time

from .common import RssWatch, Timer


def _timed(it, n_batches, count):
    t0 = time.perf_counter()
    first_t = None
    samples = first_n = 0
    for k, b in enumerate(it):
        n = count(b)
        samples += n
        if first_t is None:
            first_t, first_n = time.perf_counter(), n
        if n_batches is not None and k + 1 >= n_batches:
            break
    end = time.perf_counter()
    steady = end - (first_t or end)
    return {"samples": samples, "first_batch": (first_t - t0) if first_t else None, "seconds": end - t0,
            "steady_seconds": steady, "rate": samples / (end - t0) if end > t0 else None,
            "steady_rate": (samples - first_n) / steady if steady > 0 else None}


def _text_count(b):
    if isinstance(b, dict):
        return len(b["text"])
    if hasattr(b, "text"):
        return len(b.text)
    if hasattr(b, "tokens"):
        return int(b.tokens.shape[0])
    return len(b)


# ------------------------------------------------------------------------------ MDS

def child_mds(cfg) -> dict:
    m = cfg["manifest"]
    nw = cfg.get("workers", 2)
    bs = cfg.get("batch", 8)
    if cfg["impl"] == "mosaic":
        from streaming import StreamingDataLoader, StreamingDataset
        from streaming.base.util import clean_stale_shared_memory

        clean_stale_shared_memory()
        ds = StreamingDataset(local=m["mds"], batch_size=bs, shuffle=True, shuffle_seed=17)
    else:
        from zephon_streaming import StreamingDataLoader, StreamingDataset

        ds = StreamingDataset(local=m["mds"], batch_size=bs, shuffle=True, shuffle_seed=17)
    dl = StreamingDataLoader(ds, batch_size=bs, num_workers=nw, persistent_workers=False,
                             prefetch_factor=cfg.get("prefetch", 4) if nw else None)
    with RssWatch() as watch:
        warm = _timed(iter(dl), None, _text_count)
        with Timer() as t:
            res = _timed(iter(dl), None, _text_count)
    res.update(watch.result(), cpu=t.cpu, startup=warm["first_batch"], warm_samples=warm["samples"])
    return res


# ------------------------------------------------------------------------------ Energon

def _tokenizing_encoder_cls(base_mod):
    """A TaskEncoder (subclass of ``base_mod.DefaultTaskEncoder``) that tokenizes TextSample.text."""
    import torch

    class TokenizeEncoder(base_mod.DefaultTaskEncoder):
        def __init__(self, tok_path):
            super().__init__()
            self.tok_path = tok_path
            self._tok = None

        def encode_sample(self, sample):
            if self._tok is None:
                from tokenizers import Tokenizer

                self._tok = Tokenizer.from_file(self.tok_path)
                self._tok.enable_truncation(2048)
            ids = self._tok.encode(sample.text, add_special_tokens=False).ids
            return torch.tensor(ids, dtype=torch.int64)

        def batch(self, samples):
            n = max(len(s) for s in samples)
            out = torch.zeros((len(samples), n), dtype=torch.int64)
            for i, s in enumerate(samples):
                out[i, :len(s)] = s
            return out

        def encode_batch(self, batch):
            return batch

    return TokenizeEncoder


def child_energon(cfg) -> dict:
    os.environ["TOKENIZERS_PARALLELISM"] = "false"
    m = cfg["manifest"]
    nw, bs = cfg.get("workers", 2), cfg.get("batch", 8)
    if cfg["impl"] == "energon":
        import megatron.energon as mod
    else:
        import zephon_energon as mod
    kw = {}
    if cfg.get("task_encoder") == "tokenize":
        kw["task_encoder"] = _tokenizing_encoder_cls(mod)(m["tokenizer"])
    wc = mod.WorkerConfig(rank=0, world_size=1, num_workers=nw)
    ds = mod.get_train_dataset(m["wds"], worker_config=wc, batch_size=bs, shuffle_buffer_size=100,
                               max_samples_per_sequence=100, **kw)
    loader = mod.get_loader(ds, worker_config=wc, prefetch_factor=cfg.get("prefetch", 4))
    per_pass = m["docs"] // bs
    count = (lambda b: int(b.shape[0])) if "task_encoder" in kw else _text_count
    with RssWatch() as watch:
        with Timer() as t:
            it = iter(loader)
            warm = _timed(it, max(4, per_pass // 4), count)
            res = _timed(it, per_pass, count)
    # The rate covers the whole iteration (start-up, warm-up and timed part): the loaders buffer to
    # different depths, so timing only a later window would credit the deeper prefetch (work done
    # during the warm-up) instead of throughput. ``steady_rate`` is the later window alone.
    res.update(watch.result(), cpu=t.cpu, startup=warm["first_batch"], samples=warm["samples"] + res["samples"],
               seconds=t.seconds, rate=(warm["samples"] + res["samples"]) / t.seconds)
    return res
