"""Pipeline builders and an independent global-batch hash for the engine tests."""
from __future__ import annotations

import hashlib
import json
import os
import signal
import threading
import time
import inspect
from collections import defaultdict
from contextlib import contextmanager
from fractions import Fraction

from zephon.engine import Loader
from zephon.formats import open_dataset
from zephon.ops import Batch, Decode, Pack, Shuffle, Tokenize

FIELDS = ("input_ids", "labels", "position_ids", "attention_mask")


def make_loader(dirs, tokenizer, *, dp=1, rank=0, runner="inline", micro_batch=1, canonical_replicas=8,
                global_batch_size=None, max_length=128, seed=0, exhaustion="repeat", drop_last=True,
                chunk_size=32, flush_every_k_chunks=2, shuffle_buffer=4, weights=None, fmt=None,
                on_error="raise", lane_assignment="contiguous", num_workers=2, unit_size=32, extra_ops=(),
                pre_pack_ops=(), pack_method="best_fit"):
    datasets = [open_dataset(d, format=fmt, on_error=on_error) for d in dirs]
    tok_max = None if pack_method == "concat" else max_length  # concat cuts documents of any length
    ops = [Decode("text"), *extra_ops, Tokenize(tokenizer, eos_id="<eos>", max_length=tok_max),
           *pre_pack_ops, Pack(max_length, method=pack_method)]
    if shuffle_buffer:
        ops.append(Shuffle(shuffle_buffer, seed=seed))
    ops.append(Batch(micro_batch, drop_last=drop_last))
    return Loader(datasets, ops, weights=weights, seed=seed, canonical_replicas=canonical_replicas,
                  chunk_size=chunk_size, global_batch_size=global_batch_size or 2 * canonical_replicas,
                  exhaustion=exhaustion, flush_every_k_chunks=flush_every_k_chunks, dp_degree=dp, dp_rank=rank,
                  runner=runner, num_workers=num_workers, lane_assignment=lane_assignment, unit_size=unit_size)


class StepHasher:
    """Test-side oracle hash, written independently of zephon.engine.hashing: per step, SHA-256 of
    every row's fields, lanes in ascending order, rows in delivery order within a lane."""

    def __init__(self):
        self.rows = defaultdict(lambda: defaultdict(list))

    def add(self, mb):
        for i in range(len(mb["input_ids"])):
            self.rows[mb["__step__"]][mb["__lane__"]].append(b"".join(mb[f][i].tobytes() for f in FIELDS))

    def digests(self):
        return {s: hashlib.sha256(b"".join(r for lane in sorted(ls) for r in ls[lane])).hexdigest()
                for s, ls in self.rows.items()}


def run_steps(loaders, steps, hasher):
    """Pull exactly one global step per iteration from every rank, for ``steps`` steps."""
    iters = [iter(L) for L in loaders]
    for _ in range(steps):
        for L, it in zip(loaders, iters):
            for _ in range(len(L.lanes) * (L.rows_per_lane_step // L.batch.micro_batch_size)):
                hasher.add(next(it))
    for it in iters:
        it.close()


def reference_digests(dirs, tokenizer, steps=None, **kwargs):
    """Per-step ``StepHasher`` digests of one uninterrupted single-rank core Loader (``make_loader`` with
    ``kwargs``): ``steps`` global steps, or the whole stream when None (a finite one)."""
    h = StepHasher()
    L = make_loader(dirs, tokenizer, **kwargs)
    try:
        if steps is None:
            for mb in L:
                h.add(mb)
        else:
            run_steps([L], steps, h)
    finally:
        L.close()
    return h.digests()


REQUIRED = inspect.Parameter.empty  # host_keywords' value for a parameter without a default


def host_keywords(fn) -> dict:
    """{name: default} of every parameter of ``fn`` a caller can pass by keyword (``self`` excluded);
    ``REQUIRED`` for one without a default. The host framework's own signature, as a test oracle."""
    return {p.name: p.default for p in inspect.signature(fn).parameters.values()
            if p.name != "self" and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}


def count_preads(monkeypatch) -> list[int]:
    """Patch ``os.pread`` to record the size of every read; returns the (growing) list of sizes in bytes."""
    import os

    sizes: list[int] = []
    real = os.pread

    def counting(fd, n, at):
        out = real(fd, n, at)
        sizes.append(len(out))
        return out
    monkeypatch.setattr(os, "pread", counting)
    return sizes


def schedule_weight(spec, step):
    """Energon PR #208's semantics, written independently: step = value of the greatest key <= step;
    linear = interpolation between keys, constant outside."""
    if not isinstance(spec, dict):
        return Fraction(spec)
    (kind, pts), = spec.items()
    pts = sorted((int(k), Fraction(v)) for k, v in pts.items())
    if kind == "step":
        return [v for k, v in pts if k <= step][-1] if step >= pts[0][0] else pts[0][1]
    if step <= pts[0][0]:
        return pts[0][1]
    for (k0, v0), (k1, v1) in zip(pts, pts[1:]):
        if step <= k1:
            return v0 + (v1 - v0) * Fraction(step - k0, k1 - k0)
    return pts[-1][1]


@contextmanager
def world(rank, size):
    """RANK / WORLD_SIZE / LOCAL_WORLD_SIZE set for one simulated rank (one node), restored afterwards."""
    keys = ("RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE")
    old = {k: os.environ.get(k) for k in keys}
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(size), LOCAL_WORLD_SIZE=str(size))
    try:
        yield
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


@contextmanager
def deadline(seconds: int, what: str):
    """Fail (instead of hanging the suite) when the body runs longer than ``seconds``; ``what`` says what hung."""
    def on_alarm(*_):
        raise TimeoutError(f"still running after {seconds} s: {what}")

    old = signal.signal(signal.SIGALRM, on_alarm)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


def write_split_jsonl(root, name, n_shards, per_shard, offset):
    """JSONL dataset ``root/name/train/part-S.jsonl`` of records ``{"id": k, "text": ...}``, k from ``offset``
    (unique, so a reader can name every sample). Returns ``root/name`` (split ``train``)."""
    d = os.path.join(root, name, "train")
    os.makedirs(d)
    for s in range(n_shards):
        with open(os.path.join(d, f"part-{s}.jsonl"), "w") as f:
            for i in range(per_shard):
                k = offset + s * per_shard + i
                f.write(json.dumps({"id": k, "text": f"sample {k} of {name}: " + "abc " * (k % 7)}) + "\n")
    return os.path.join(root, name)


class CountingReads:
    """Counts the samples a dataset's ``read`` hands to the workers (the test's own count, from any thread)."""

    def __init__(self, ds):
        self.n, inner, lock = 0, ds.read, threading.Lock()

        def read(shard, idx):
            with lock:
                self.n += len(idx)
            return inner(shard, idx)
        ds.read = read


def write_one_line_docs(root, n: int, shards: int) -> str:
    """``n`` one-line documents ``{"text": "document i says hello"}`` (one row each, unpacked) in ``shards`` JSONL
    files under ``root`` (a ``pathlib.Path``), document i in shard ``i % shards``. Returns ``str(root)``."""
    for s in range(shards):
        with open(root / f"part-{s}.jsonl", "w") as fh:
            for i in range(s, n, shards):
                fh.write(json.dumps({"text": f"document {i} says hello"}) + "\n")
    return str(root)


def one_row_loader(root, tokenizer_path, runner, **loader_kwargs):
    """``(dataset, Loader)`` over ``write_one_line_docs``' documents, unpacked (one 64-token row per document,
    one row per micro-batch), two workers of ``runner``; ``loader_kwargs`` go to ``Loader``."""
    ds = open_dataset(root)
    ops = [Decode("text"), Tokenize(tokenizer_path, eos_id="<eos>", max_length=64), Batch(1)]
    return ds, Loader([ds], ops, runner=runner, num_workers=2, **loader_kwargs)


def wait_until(cond, seconds: float, what: str) -> None:
    """Poll ``cond`` until it holds; fail naming ``what`` after ``seconds`` (generous: no speed is asserted)."""
    import pytest

    end = time.monotonic() + seconds
    while not cond():
        if time.monotonic() > end:
            pytest.fail(f"waited {seconds} s for {what}")
        time.sleep(0.01)
