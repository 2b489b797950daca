"""A loop that never waits (issue 29, item 3): the workers keep working while the consumer is away from ``next()``,
as far as the read-ahead bound, and the stream stays the one the inline runner gives."""
from __future__ import annotations

import gc
import hashlib
import threading
import time

import numpy as np
import pytest


from helpers import CountingReads, one_row_loader, write_one_line_docs

LANES, AHEAD, UNIT = 4, 8, 2


@pytest.fixture(scope="module")
def one_row_docs(tmp_path_factory):
    """2,000 one-line documents (one row each: no packing), in 2 JSONL shards."""
    return write_one_line_docs(tmp_path_factory.mktemp("one_row_docs"), 2000, 2)


def _loader(root, tokenizer_path, runner):
    return one_row_loader(root, tokenizer_path, runner, canonical_replicas=LANES, chunk_size=16, unit_size=UNIT,
                          read_ahead_steps=AHEAD)


def _digest(mb) -> str:
    return hashlib.sha256(np.ascontiguousarray(mb["input_ids"]).tobytes()).hexdigest()


def _wait_until(cond, seconds: float, what: str) -> None:
    """Poll ``cond`` until it holds; fail naming ``what`` after ``seconds`` (generous: no speed is asserted)."""
    end = time.monotonic() + seconds
    while not cond():
        if time.monotonic() > end:
            pytest.fail(f"waited {seconds} s for {what}")
        time.sleep(0.01)


def test_workers_fill_the_read_ahead_while_the_consumer_is_away(one_row_docs, tokenizer_path):
    """One row per document and one row per lane step: after the first global step the consumer stays away from
    ``next()``; the workers read on until every lane holds ``AHEAD`` steps (the test counts the documents read:
    LANES x (1 + AHEAD)), which the old in-``next()`` dispatch never reached (it stopped two steps ahead). They
    stop at the documented bound (AHEAD steps plus two units per lane). The stream is the inline runner's, and an
    abandoned iterator leaves no dispatcher thread behind."""
    _, ref_loader = _loader(one_row_docs, tokenizer_path, "inline")
    ref_it = iter(ref_loader)
    ref = [_digest(next(ref_it)) for _ in range(LANES * 20)]
    ref_loader.close()

    ds, loader = _loader(one_row_docs, tokenizer_path, "threads")
    reads = CountingReads(ds)
    it = iter(loader)
    got = [_digest(next(it)) for _ in range(LANES)]  # the first global step
    target = LANES * (1 + AHEAD)
    _wait_until(lambda: reads.n >= target, 120,
                f"the workers to read {target} documents with the consumer away (read {reads.n})")
    assert reads.n <= LANES * (1 + AHEAD + 2 * UNIT), f"read {reads.n} documents: past the read-ahead bound"
    got += [_digest(next(it)) for _ in range(LANES * 19)]
    assert got == ref
    del it
    gc.collect()
    _wait_until(lambda: not [t for t in threading.enumerate() if t.name == "zephon-dispatch"], 60,
                "the dispatcher thread to end after its iterator was dropped")
