"""A loop that never waits (issue 29, item 3): the workers keep working while the consumer is away from ``next()``,
as far as the read-ahead bound, and the stream stays the one the inline runner gives."""
from __future__ import annotations

import gc
import hashlib
import threading

import numpy as np
import pytest


from helpers import CountingReads, one_row_loader, wait_until, write_one_line_docs
from zephon.engine import Loader
from zephon.formats import open_dataset
from zephon.ops import Batch, Decode, Map, Tokenize
from zephon.ops.base import Operator

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
    wait_until(lambda: reads.n >= target, 120,
                f"the workers to read {target} documents with the consumer away (read {reads.n})")
    assert reads.n <= LANES * (1 + AHEAD + 2 * UNIT), f"read {reads.n} documents: past the read-ahead bound"
    got += [_digest(next(it)) for _ in range(LANES * 19)]
    assert got == ref
    del it
    gc.collect()
    wait_until(lambda: not [t for t in threading.enumerate() if t.name == "zephon-dispatch"], 60,
                "the dispatcher thread to end after its iterator was dropped")


class _Gate(Operator):
    """A pass-through accumulator whose ``push`` blocks, once armed, until the test opens it: a lane's packing
    that takes as long as the test wants, on the dispatcher thread."""

    name = "gate"

    def __init__(self):
        self.armed, self.entered, self.go = threading.Event(), threading.Event(), threading.Event()

    def new_accumulator(self, lane):
        return _GateAccumulator(self)


class _GateAccumulator:
    def __init__(self, gate: _Gate):
        self.gate = gate

    def push(self, record):
        if self.gate.armed.is_set():
            self.gate.armed.clear()
            self.gate.entered.set()
            if not self.gate.go.wait(120):
                raise RuntimeError("the test never opened the gate")
        return [record]

    def flush(self):
        return []


def test_the_consumer_takes_rows_while_a_lane_packs(one_row_docs, tokenizer_path):
    """A lane's accumulators run on the dispatcher thread outside the loader's lock: while one lane's ``push``
    is blocked (the gate), the consumer takes the rows other lanes hold and reads ``checkpoint()`` and
    ``metrics()``. The old dispatcher held the lock while it packed, so these waited for the gate (the test opens
    it only after them: a hang, bounded and named). The stream is the inline runner's."""
    def loader(runner, gate):
        ds = open_dataset(one_row_docs)
        ops = [Decode("text"), Tokenize(tokenizer_path, eos_id="<eos>", max_length=64), gate, Batch(1)]
        return ds, Loader([ds], ops, runner=runner, num_workers=2, canonical_replicas=LANES, chunk_size=16,
                          unit_size=UNIT, read_ahead_steps=AHEAD)

    _, ref_loader = loader("inline", _Gate())
    ref_it = iter(ref_loader)
    ref = [_digest(next(ref_it)) for _ in range(LANES * 12)]
    ref_loader.close()

    gate = _Gate()
    ds, L = loader("threads", gate)
    reads = CountingReads(ds)
    it = iter(L)
    got = [_digest(next(it)) for _ in range(LANES)]  # the first global step, gate open
    wait_until(lambda: reads.n >= LANES * (1 + AHEAD), 120, "the workers to fill the read-ahead")
    gate.armed.set()
    out: dict = {"rows": []}

    def consume():
        # take micro-batches until a lane falls below its bound, reads again and its push reaches the gate
        while not gate.entered.wait(0.05) and len(out["rows"]) < LANES * AHEAD:
            out["rows"].append(_digest(next(it)))
        out["entered_after"] = len(out["rows"])
        # the gate holds the dispatcher: the lanes still hold rows of their read-ahead; take a whole step
        out["rows"] += [_digest(next(it)) for _ in range(LANES)]
        out["checkpoint"] = L.checkpoint()
        out["metrics"] = L.metrics()

    t = threading.Thread(target=consume, daemon=True)
    t.start()
    assert gate.entered.wait(120), "no lane pushed again after the consumer took rows (waited 120 s)"
    t.join(120)
    blocked = t.is_alive()
    gate.go.set()  # open the gate either way, so a failure does not leave the dispatcher blocked
    t.join(120)
    assert not blocked, ("next(), checkpoint() and metrics() waited 120 s while a lane's accumulator ran: the "
                         "dispatcher held the loader's lock while it packed")
    got += out["rows"]
    assert out["entered_after"] < LANES * AHEAD
    assert out["metrics"]["rows"] == len(got)  # every micro-batch is one row
    got += [_digest(next(it)) for _ in range(LANES * 12 - len(got))]
    assert got == ref
    L.close()


def test_a_finite_padded_pass_yields_its_first_micro_batch_before_other_lanes_have_rows(one_row_docs,
                                                                                          tokenizer_path):
    """A finite pass with ``Batch(drop_last=False)`` pads its last steps, so every lane fills every step and the
    first micro-batch (lane 0's) need not wait for the other lanes: the tail asks a lane for its rows only when
    their micro-batch comes (and one live lane tells that the step is owed). Lane 1's first document blocks in a
    worker (a Map) until the test has lane 0's micro-batch; the old tail asked every lane for its step's rows
    first, so it waited for lane 1 (a hang, bounded and named). The stream is the inline runner's, no gate."""
    blocked_text: dict = {}
    release = threading.Event()

    def hold(record):
        if record["text"] == blocked_text.get("text") and not release.wait(120):
            raise RuntimeError("the test never released lane 1's document")
        return record

    def loader(runner):
        ds = open_dataset(one_row_docs)
        ops = [Decode("text"), Map(hold, name="hold"), Tokenize(tokenizer_path, eos_id="<eos>", max_length=64),
               Batch(1, drop_last=False)]
        return Loader([ds], ops, runner=runner, num_workers=2, canonical_replicas=LANES, chunk_size=16,
                      unit_size=UNIT, exhaustion="stop")

    with loader("inline") as ref_loader:
        ref = [(mb["__lane__"], _digest(mb)) for mb in ref_loader]
        lane1 = [r for r in ref_loader.explain(0, text_field="text")["rows"] if r["lane"] == 1]
    blocked_text["text"] = lane1[0]["pieces"][0]["text"]
    assert ref[0][0] == 0 and len(ref) == 2000  # one row per document, lane 0 first

    L = loader("threads")
    it = iter(L)
    first: dict = {}
    t = threading.Thread(target=lambda: first.update(mb=next(it)), daemon=True)
    t.start()
    t.join(120)
    got_first = "mb" in first
    release.set()
    t.join(120)
    assert got_first, ("waited 120 s for the first micro-batch of a padded finite pass while lane 1's first "
                       "document was held: the tail waited for every lane's rows")
    got = [(first["mb"]["__lane__"], _digest(first["mb"]))] + [(mb["__lane__"], _digest(mb)) for mb in it]
    assert got == ref
    L.close()
