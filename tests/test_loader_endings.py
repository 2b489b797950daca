"""How an iteration ends when something goes wrong: close() inside or beside the loop, Ctrl-C while a worker is
stuck, a finite pass that yields nothing, and bad data surfacing at the same micro-batch whatever the runner."""
from __future__ import annotations

import json
import os
import random
import signal
import threading

import pytest

from helpers import write_one_line_docs
from zephon.engine import Loader
from zephon.formats import DataError, open_dataset
from zephon.ops import Batch, Decode, Filter, Map, Pack, Shuffle, Tokenize

LANES = 4


@pytest.fixture(scope="module")
def docs(tmp_path_factory):
    """400 one-line documents (one row each, unpacked) in 2 JSONL shards."""
    return write_one_line_docs(tmp_path_factory.mktemp("endings"), 400, 2)


def _loader(root, tok, runner, extra=(), **kw):
    ops = [Decode("text"), *extra, Tokenize(tok, eos_id="<eos>", max_length=64), Batch(1)]
    return Loader([open_dataset(root)], ops, runner=runner, num_workers=2, canonical_replicas=LANES, chunk_size=16,
                  **kw)


@pytest.mark.parametrize("runner", ["inline", "threads"])
def test_close_inside_the_loop_ends_the_iterator_saying_so(docs, tokenizer_path, runner):
    """close() in the loop body: the next micro-batch raises a RuntimeError naming close(), not more micro-batches
    from the buffers and then an internal error; a new iter() continues right after the last one delivered."""
    L = _loader(docs, tokenizer_path, runner)
    ref = [int(mb["input_ids"][0, 1]) for mb, _ in zip(_loader(docs, tokenizer_path, "inline"), range(30))]
    got = []
    with pytest.raises(RuntimeError, match=r"Loader\.close\(\) was called"):
        for mb in L:
            got.append(int(mb["input_ids"][0, 1]))
            if len(got) == 20:
                L.close()
    assert len(got) == 20
    got += [int(mb["input_ids"][0, 1]) for mb, _ in zip(L, range(10))]
    assert got == ref
    L.close()


def _stuck_loader(docs, tok, gate: threading.Event):
    """A threads loader whose every document waits in a worker (a Map) until ``gate`` is set."""
    def hold(record):
        if not gate.wait(120):
            raise RuntimeError("the test never opened the gate")
        return record
    return _loader(docs, tok, "threads", extra=[Map(hold, name="hold")])


def test_ctrl_c_while_a_worker_is_stuck_reaches_the_loop_at_once(docs, tokenizer_path):
    """SIGINT while next() waits on a worker stuck in a slow read: KeyboardInterrupt reaches the loop before the
    worker is released (the iteration's end no longer waits for units in flight; the old code joined the pool)."""
    gate, raised = threading.Event(), threading.Event()
    L = _stuck_loader(docs, tokenizer_path, gate)

    def interrupt():  # every second until it arrives: one SIGINT can land in a finalizer, where Python ignores it
        while not raised.wait(1.0):
            os.kill(os.getpid(), signal.SIGINT)
    timer = threading.Thread(target=interrupt, daemon=True)
    watchdog = threading.Timer(30.0, gate.set)  # the stuck read ends after 30 s: the old code waited for it
    # Python's own Ctrl-C handler, as in a terminal: a process started in the background by a non-interactive shell
    # (`nohup ... &`, some CI runners) inherits SIGINT ignored, and then no KeyboardInterrupt is ever raised
    inherited = signal.signal(signal.SIGINT, signal.default_int_handler)
    timer.start()
    watchdog.start()
    try:
        with pytest.raises(KeyboardInterrupt):
            next(iter(L))
        released_before = gate.is_set()
    finally:
        raised.set()
        timer.join(5)
        watchdog.cancel()
        gate.set()
        signal.signal(signal.SIGINT, inherited)
    assert not released_before, "KeyboardInterrupt reached the loop only after the stuck worker was released"


def test_close_from_another_thread_ends_a_waiting_next_with_its_reason(docs, tokenizer_path):
    """close() from another thread while next() waits on a stuck worker: next() raises a RuntimeError about the
    close (close() itself waits for the workers, as documented)."""
    gate = threading.Event()
    L = _stuck_loader(docs, tokenizer_path, gate)
    it = iter(L)
    out: dict = {}

    def consume():
        try:
            next(it)
        except Exception as e:  # what the loop sees
            out["error"] = e
    t = threading.Thread(target=consume, daemon=True)
    t.start()
    t.join(1.0)
    closer = threading.Thread(target=L.close, daemon=True)
    closer.start()
    t.join(120)
    gate.set()
    closer.join(120)
    assert not t.is_alive() and not closer.is_alive(), "next() or close() still waiting after 120 s"
    assert isinstance(out.get("error"), RuntimeError) and "close" in str(out["error"]), out


@pytest.mark.parametrize("runner", ["inline", "threads"])
@pytest.mark.parametrize("drop_last,short_last", [(True, False), (False, False), (False, True)])
def test_a_finite_pass_that_filters_everything_is_an_error(docs, tokenizer_path, runner, drop_last, short_last):
    """Every document filtered in a finite pass: a DataError counting the 400 filtered documents, not a pass that
    ends silently with no micro-batch (an endless stream raised already)."""
    ops = [Decode("text"), Filter(lambda r: False, name="none"), Tokenize(tokenizer_path, eos_id="<eos>",
           max_length=64), Pack(64), Batch(1, drop_last=drop_last, short_last=short_last)]
    L = Loader([open_dataset(docs)], ops, runner=runner, num_workers=2, canonical_replicas=LANES, chunk_size=16,
               exhaustion="stop")
    with pytest.raises(DataError, match=r"delivered nothing .* filtered \(400\)"):
        list(L)
    L.close()


def test_bad_data_surfaces_at_the_same_micro_batch_with_every_runner(tmp_path, tokenizer_path):
    """A malformed line mid-shard: inline, threads and processes deliver the same micro-batches (a prefix of the
    skip-mode stream) and raise the same DataError at the same point. inline used to raise as soon as it read the
    failing unit, steps before the rows that precede it were delivered (104 micro-batches against 168 here)."""
    rng = random.Random(0)
    for f in range(3):
        lines = [json.dumps({"text": f"f{f}d{i} " + "".join(rng.choice("abcdefgh xyz")
                                                           for _ in range(rng.randint(5, 300)))}) for i in range(800)]
        if f == 1:
            lines[400] = '{"text": "broken'  # line 401: not JSON
        (tmp_path / f"part-{f:03d}.jsonl").write_text("\n".join(lines) + "\n")

    def run(runner, on_error="raise"):
        ops = [Decode("text"), Tokenize(tokenizer_path, eos_id="<eos>", max_length=128), Pack(128), Shuffle(8),
               Batch(1, drop_last=False)]
        got, err = [], None
        with Loader([open_dataset(str(tmp_path), on_error=on_error)], ops, runner=runner, num_workers=2,
                    canonical_replicas=8, chunk_size=32, exhaustion="stop") as L:
            try:
                for mb in L:
                    got.append(mb["input_ids"].tobytes())
            except DataError as e:
                err = str(e)
        return got, err

    skip, _ = run("inline", on_error="skip")
    results = {r: run(r) for r in ("inline", "threads", "processes")}
    for runner, (got, err) in results.items():
        assert err is not None and "line 401" in err, (runner, err)
        assert 0 < len(got) < len(skip) and got == skip[:len(got)], runner
    assert len({len(got) for got, _ in results.values()}) == 1, {r: len(g) for r, (g, _) in results.items()}
