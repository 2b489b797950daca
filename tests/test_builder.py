"""Micro-batches built ahead of the consumer (engine/builder.py, issue 29 item 3): the builder thread builds the
next step while the consumer is away from ``next()``, and what it built but the consumer has not taken is never
counted as delivered (checkpoint, restore, close). Oracle: an uninterrupted inline run over the same documents."""
from __future__ import annotations

import gc
import hashlib
import threading
import time

import numpy as np
import pytest

import zephon.engine.tail as tail_module
from helpers import one_row_loader, wait_until, write_one_line_docs

LANES = 4


@pytest.fixture(scope="module")
def docs(tmp_path_factory):
    """600 one-line documents (one row, one micro-batch each), in 2 JSONL shards."""
    return write_one_line_docs(tmp_path_factory.mktemp("builder_docs"), 600, 2)


def _loader(root, tokenizer_path, runner):
    return one_row_loader(root, tokenizer_path, runner, canonical_replicas=LANES, chunk_size=16, unit_size=2)[1]


def _digest(mb) -> str:
    return hashlib.sha256(np.ascontiguousarray(mb["input_ids"]).tobytes()).hexdigest()


@pytest.fixture
def built_on(monkeypatch):
    """The names of the threads that collated each micro-batch, in order (the tail's ``collate``, recorded)."""
    names: list[str] = []
    inner = tail_module.collate

    def collate(rows):
        names.append(threading.current_thread().name)
        return inner(rows)

    monkeypatch.setattr(tail_module, "collate", collate)
    return names


def test_the_builder_builds_ahead_and_only_delivered_micro_batches_count(docs, tokenizer_path, built_on):
    """The consumer takes a step and one micro-batch, then stays away: the builder thread collates the rest of the
    step (not the consumer's thread). A checkpoint then says what the consumer has, not what was built: a fresh
    inline loader restored from it continues exactly where the uninterrupted run does, and so does the threads
    iterator itself, the built micro-batches handed over in order. A restore() while micro-batches are built ahead
    drops them, and an abandoned iterator leaves no builder thread."""
    with _loader(docs, tokenizer_path, "inline") as ref_loader:
        ref = [_digest(mb) for mb, _ in zip(ref_loader, range(LANES * 8))]
    built_on.clear()

    L = _loader(docs, tokenizer_path, "threads")
    it = iter(L)
    taken = LANES + 1
    got = [_digest(next(it)) for _ in range(taken)]
    wait_until(lambda: len(built_on) >= LANES * 2, 120,
               f"the builder to build the rest of step 1 with the consumer away ({len(built_on)} built)")
    assert len(built_on) == LANES * 2, "the builder went past one step"  # it waits for step 1 to be delivered
    assert set(built_on) == {"zephon-build"}, built_on
    state = L.checkpoint()

    with _loader(docs, tokenizer_path, "inline") as resumed:
        resumed.restore(state)
        assert [_digest(mb) for mb, _ in zip(resumed, range(LANES * 2))] == ref[taken:taken + LANES * 2]

    got += [_digest(next(it)) for _ in range(LANES * 3)]
    assert got == ref[:len(got)]

    # built ahead again, then restored: what was built is not delivered; the restored state's stream is
    wait_until(lambda: len(built_on) >= len(got) + LANES - 1, 120, "the builder to build ahead again")
    L.restore(state)
    with pytest.raises(RuntimeError, match="superseded"):
        next(it)
    it = iter(L)
    assert [_digest(next(it)) for _ in range(LANES * 2)] == ref[taken:taken + LANES * 2]

    del it
    gc.collect()
    wait_until(lambda: not [t for t in threading.enumerate() if t.name == "zephon-build"], 60,
               "the builder thread to end after its iterator was dropped")
    L.close()


def test_close_from_another_thread_ends_a_consumer_waiting_for_the_builder(docs, tokenizer_path):
    """A consumer blocked in ``next()`` (the builder waits for rows a held worker never gives) is told, not left
    hanging, when another thread closes the loader."""
    release = threading.Event()
    from zephon.engine import Loader
    from zephon.formats import open_dataset
    from zephon.ops import Batch, Decode, Map, Tokenize

    def hold(record):
        if not release.wait(120):
            raise RuntimeError("the test never released the worker")
        return record

    ds = open_dataset(docs)
    L = Loader([ds], [Decode("text"), Map(hold, name="hold"), Tokenize(tokenizer_path, eos_id="<eos>", max_length=64),
                      Batch(1)], runner="threads", num_workers=2, canonical_replicas=LANES, chunk_size=16)
    it = iter(L)
    out: dict = {}

    def consume():
        try:
            next(it)
        except BaseException as e:  # noqa: BLE001 - the test reports what the consumer got
            out["error"] = e

    t = threading.Thread(target=consume, daemon=True)
    t.start()
    t.join(1.0)
    assert t.is_alive(), "next() returned although every worker was held"
    closer = threading.Thread(target=L.close, daemon=True)  # close() waits for the held units: not this thread
    closer.start()
    t.join(60)
    ended = not t.is_alive()
    release.set()
    closer.join(60)
    assert ended, "the consumer still waits 60 s after close() from another thread"
    assert isinstance(out.get("error"), RuntimeError) and "close()" in str(out["error"]), out


def test_delivery_never_waits_for_the_loaders_lock(docs, tokenizer_path):
    """While another thread holds the loader's lock (``checkpoint()`` or ``stats()`` from a monitor, the dispatcher
    publishing), ``next()`` still hands over a micro-batch the builder built: its delivery is one store, so a Ctrl-C
    in ``next()`` cannot land after the micro-batch was counted and before it was returned while ``next()`` waits on
    that lock (it did: the builder was woken holding the lock). The stream is the inline run's."""
    with _loader(docs, tokenizer_path, "inline") as ref_loader:
        ref = [_digest(mb) for mb, _ in zip(ref_loader, range(LANES * 3))]
    L = _loader(docs, tokenizer_path, "threads")
    it = iter(L)
    got = [_digest(next(it)) for _ in range(LANES + 1)]
    wait_until(lambda: L.tail.builder is not None and len(L.tail.builder.ready) == LANES - 1, 120,
               "the builder to build the rest of step 1")
    held, release = threading.Event(), threading.Event()

    def hold():
        with L._lock:
            held.set()
            release.wait(60)

    h = threading.Thread(target=hold, daemon=True)
    h.start()
    assert held.wait(60)
    out: dict = {}
    t = threading.Thread(target=lambda: out.update(mbs=[_digest(next(it)) for _ in range(LANES - 1)]), daemon=True)
    t.start()
    t.join(30)
    returned = "mbs" in out
    release.set()
    h.join(60)
    t.join(60)
    assert returned, "next() waited 30 s for the loader's lock to hand over micro-batches already built"
    got += out["mbs"]
    got += [_digest(next(it)) for _ in range(LANES * 3 - len(got))]
    assert got == ref
    L.close()


def test_a_drop_last_pass_drops_its_tail_only_when_asked(docs, tokenizer_path):
    """With ``Batch(drop_last=True)`` a finite pass's incomplete last step is dropped (and counted) when the
    consumer asks past the last whole step, as inside ``next()``: once every micro-batch was taken, and before, the
    builder has counted nothing dropped, and the checkpoint is the inline run's at the same point (it counted the
    drop as soon as the last micro-batch was taken: stats and checkpoint bytes depended on timing)."""
    from zephon.engine import Loader
    from zephon.formats import open_dataset
    from zephon.ops import Batch, Decode, Tokenize

    def loader(runner):
        ds = open_dataset(docs)
        ops = [Decode("text"), Tokenize(tokenizer_path, eos_id="<eos>", max_length=64), Batch(4, drop_last=True)]
        return Loader([ds], ops, runner=runner, num_workers=2, canonical_replicas=LANES, chunk_size=16,
                      exhaustion="stop")

    with loader("inline") as ref_loader:
        n = sum(1 for _ in ref_loader)
        dropped = ref_loader.stats()["dropped_rows"]
    assert dropped > 0, "the corpus must leave an incomplete last step for this test"
    states = {}
    for runner in ("inline", "threads"):
        with loader(runner) as L:
            it = iter(L)
            for _ in range(n):
                next(it)
            time.sleep(0.5)  # time for a builder to run ahead, if it would
            states[runner] = (L.stats()["dropped_rows"], L.checkpoint())
            assert next(it, None) is None
            assert L.stats()["dropped_rows"] == dropped
    assert states["threads"] == states["inline"] and states["inline"][0] == 0


def test_an_interrupt_while_the_builder_starts_leaves_the_loader_usable(docs, tokenizer_path, monkeypatch):
    """A Ctrl-C that lands inside ``Thread.start`` of the builder reaches the loop as KeyboardInterrupt (not a
    ``RuntimeError`` of joining a thread never started, which then came back from every ``iter()`` and ``close()``);
    the next iteration continues exactly where the uninterrupted run is, and no thread is left."""
    import zephon.engine.builder as builder_module

    with _loader(docs, tokenizer_path, "inline") as ref_loader:
        ref = [_digest(mb) for mb, _ in zip(ref_loader, range(LANES))]
    real = builder_module.Builder.start

    def interrupted(self):
        raise KeyboardInterrupt

    monkeypatch.setattr(builder_module.Builder, "start", interrupted)
    L = _loader(docs, tokenizer_path, "threads")
    with pytest.raises(KeyboardInterrupt):
        next(iter(L))
    monkeypatch.setattr(builder_module.Builder, "start", real)
    assert [_digest(mb) for mb, _ in zip(L, range(LANES))] == ref
    L.close()
    wait_until(lambda: not [t for t in threading.enumerate() if t.name in ("zephon-build", "zephon-dispatch")], 60,
               "the loader's threads to end after close()")


def test_restore_ends_the_superseded_builder(docs, tokenizer_path):
    """``restore()`` stops the superseded iteration's builder thread at once (the old iterator may stay referenced
    and never be advanced again); the old iterator then says it was superseded."""
    L = _loader(docs, tokenizer_path, "threads")
    it = iter(L)
    next(it)
    wait_until(lambda: L.tail.builder is not None and len(L.tail.builder.ready) == LANES - 1, 120,
               "the builder to build the rest of step 1 (it then waits for the consumer)")
    state = L.checkpoint()
    L.restore(state)
    wait_until(lambda: not [t for t in threading.enumerate() if t.name == "zephon-build"], 60,
               "the superseded builder thread to end after restore()")
    with pytest.raises(RuntimeError, match="superseded"):
        next(it)
    L.close()


def _at_event(n: int, act, run) -> bool:
    """Run ``run()`` in this thread and call ``act()`` at its ``n``-th traced call or line event (stdlib code that
    ``run`` calls is traced too, C code is not): where a signal handler or a garbage collection can run Python code.
    Returns whether ``act`` ran (False: ``run`` has fewer events)."""
    import sys

    left = [n]

    def trace(frame, event, arg):
        if event in ("call", "line") and left[0] > 0:
            left[0] -= 1
            if left[0] == 0:
                sys.settrace(None)
                act()
        return trace

    sys.settrace(trace)
    try:
        run()
    except KeyboardInterrupt:
        pass
    finally:
        sys.settrace(None)
    return left[0] == 0


@pytest.mark.parametrize("what", ["interrupt", "finalizer"])
def test_a_wake_still_wakes_after_an_interrupt_or_a_finalizer_anywhere_inside_it(what):
    """The consumer sets the builder's wake on every delivery, and the garbage collector may run an abandoned
    loader's finalizer (which sets its threads' wakes) on any thread. A Ctrl-C (``interrupt``) or a nested ``set``
    (``finalizer``) at any line of ``set`` / ``clear`` / ``wait``, including the standard library code they run,
    neither deadlocks nor leaves the wake unable to wake its thread. ``threading.Event``'s plain lock deadlocked on
    the nested ``set``; a ``Condition`` left its lock held after an interrupt inside its ``__exit__``, and the
    waiting thread never woke."""
    from zephon.engine.wake import Wake

    def interrupt():
        raise KeyboardInterrupt

    for n in range(1, 200):
        w = Wake()
        fired = _at_event(n, interrupt if what == "interrupt" else w.set,
                          lambda: (w.set(), w.clear(), w.wait(0), w.set()))
        if not fired:
            break
        w.clear()
        got: list = []
        t = threading.Thread(target=lambda: got.append(w.wait(10)), daemon=True)
        t.start()
        time.sleep(0.01)
        w.set()
        t.join(10)
        assert got == [True], f"{what} at event {n}: the wake no longer wakes its thread"
    assert n > 3, "the wake's methods were never traced"


def test_an_interrupt_while_the_cleanup_stops_the_builder_still_stops_the_workers(docs, tokenizer_path, monkeypatch):
    """A Ctrl-C that lands while the iteration's own cleanup stops its builder thread reaches the loop, and the
    cleanup still stops the dispatcher and the workers (it used to skip them: they lived until the next ``iter()``
    or ``close()``). The next iteration continues exactly where the uninterrupted run is."""
    import zephon.engine.builder as builder_module

    with _loader(docs, tokenizer_path, "inline") as ref_loader:
        ref = [_digest(mb) for mb, _ in zip(ref_loader, range(LANES * 2))]
    L = _loader(docs, tokenizer_path, "threads")
    it = iter(L)
    got = [_digest(next(it)) for _ in range(LANES)]
    real = builder_module.Builder.stop

    def interrupted(self, wait=True):
        monkeypatch.setattr(builder_module.Builder, "stop", real)  # once: the next stop is a real one
        raise KeyboardInterrupt

    monkeypatch.setattr(builder_module.Builder, "stop", interrupted)
    with pytest.raises(KeyboardInterrupt):
        it.close()  # the generator's cleanup: the builder's stop is where the Ctrl-C lands
    assert L._runner is None and (L._dispatcher is None or L._dispatcher.stopped), \
        "the interrupted cleanup left the workers running"
    wait_until(lambda: not [t for t in threading.enumerate()
                            if t.name in ("zephon-build", "zephon-dispatch") or t.name.startswith("zephon-worker")],
               60, "the loader's threads to end after the interrupted cleanup")
    got += [_digest(mb) for mb, _ in zip(L, range(LANES))]
    assert got == ref
    L.close()


def test_close_from_another_thread_beside_the_iterations_own_cleanup(docs, tokenizer_path):
    """``close()`` from another thread may run while the iteration's own cleanup stops the same runner. Made
    deterministic here: the other thread's ``close()`` runs to its end in the middle of the cleanup's (after the
    cleanup read the runner). Neither raises (the cleanup used to read the runner a second time and find ``None``),
    and the runner's threads end."""
    L = _loader(docs, tokenizer_path, "threads")
    it = iter(L)
    next(it)
    real = L._stop_runner
    errors: list = []

    class CloseBesideIt:
        """The runner's finalizer, whose ``detach()`` (the cleanup's step between its look and its stop) first
        lets another thread's ``close()`` run to its end."""

        def __init__(self):
            self.calls = 0

        def detach(self):
            self.calls += 1
            if self.calls == 1:
                def close():
                    try:
                        L.close()
                    except BaseException as e:  # noqa: BLE001 - reported by the test
                        errors.append(e)
                t = threading.Thread(target=close)
                t.start()
                t.join(60)
            return real.detach()

    hook = L._stop_runner = CloseBesideIt()
    it.close()  # the iteration's own cleanup: _close(wait=False)
    assert hook.calls >= 1 and not errors, errors
    assert L._runner is None
    wait_until(lambda: not [t for t in threading.enumerate() if t.name.startswith("zephon-worker")], 60,
               "the runner's worker threads to end")


@pytest.mark.parametrize("runner", ["threads", "processes"])
def test_an_abandoned_iterator_in_a_reference_cycle_with_its_loader_is_collected(docs, tokenizer_path, runner):
    """A loader and its started iterator, kept in a reference cycle (loader -> holder -> loader) and dropped, are
    collected, which ends the iteration: its threads (and worker processes) end. The builder thread runs the
    loader's tail, and used to hold the loader: never garbage then, its threads ran until the process exited."""
    import psutil

    before = set(threading.enumerate())
    L = _loader(docs, tokenizer_path, runner)
    it = iter(L)
    for _ in range(LANES + 1):
        next(it)
    mine = [t for t in threading.enumerate() if t not in before and t.name.startswith("zephon")]
    pids = list(L._runner.pids) if runner == "processes" else []
    assert mine and len(pids) == (2 if runner == "processes" else 0)
    L.cycle = {"loader": L, "iterator": it}
    del L, it

    def ended() -> bool:
        gc.collect()  # the builder may be mid-build (holding the loader for a moment) at one collection, not at all
        return not any(t.is_alive() for t in mine) and not any(psutil.pid_exists(p) and
                                                              psutil.Process(p).status() != psutil.STATUS_ZOMBIE
                                                              for p in pids)

    wait_until(ended, 60, f"the threads {[t.name for t in mine if t.is_alive()]} and workers {pids} of a loader "
                          f"dropped in a reference cycle to end")


def test_a_stop_interrupted_before_it_took_effect_is_done_by_the_next_close(docs, tokenizer_path, monkeypatch):
    """A Ctrl-C can land inside the dispatcher's (or the builder's) ``stop()`` before it took effect. The loader
    forgets a thread only once it is stopped, so the next ``close()`` stops it (the dispatcher thread ran on after
    every later ``close()``: the loader had already forgotten it)."""
    from zephon.engine.dispatch import Dispatcher

    real, calls = Dispatcher.stop, []

    def interrupted(self, wait=True):
        calls.append(self)
        if len(calls) == 1:
            raise KeyboardInterrupt
        real(self, wait)

    monkeypatch.setattr(Dispatcher, "stop", interrupted)
    L = _loader(docs, tokenizer_path, "threads")
    it = iter(L)
    next(it)
    dispatcher = L._dispatcher
    with pytest.raises(KeyboardInterrupt):
        L.close()
    L.close()
    assert dispatcher in calls[1:], "the next close() did not stop the dispatcher the interrupted one left"
    wait_until(lambda: not dispatcher.thread.is_alive(), 60, "the dispatcher thread to end after the next close()")
    it.close()


def test_an_interrupt_inside_the_runners_close_never_leaves_a_closed_runner_to_serve(docs, tokenizer_path,
                                                                                     monkeypatch):
    """A Ctrl-C can land inside the runner's ``close()`` after it took effect (while it waits for its workers). The
    next ``iter()`` then starts a new runner and continues exactly where the uninterrupted run is (it reused the
    closed runner: ``cannot schedule new futures after shutdown``)."""
    from zephon.engine.runners import ThreadRunner

    with _loader(docs, tokenizer_path, "inline") as ref_loader:
        ref = [_digest(mb) for mb, _ in zip(ref_loader, range(LANES * 3))]
    real = ThreadRunner.close

    def interrupted(self, wait=True):
        real(self, wait)
        monkeypatch.setattr(ThreadRunner, "close", real)
        raise KeyboardInterrupt  # after the close took effect

    L = _loader(docs, tokenizer_path, "threads")
    it = iter(L)
    got = [_digest(next(it)) for _ in range(LANES)]
    monkeypatch.setattr(ThreadRunner, "close", interrupted)
    with pytest.raises(KeyboardInterrupt):
        L.close()
    got += [_digest(mb) for mb, _ in zip(L, range(LANES * 2))]
    assert got == ref
    L.close()


def test_the_iterations_own_end_never_waits_for_its_threads(docs, tokenizer_path, monkeypatch):
    """The iteration's own end (exhausted, raised, abandoned: then maybe a garbage collection on any thread, holding
    any lock) only tells its threads to stop; ``close()`` and a new ``iter()`` wait for them. Here the dispatcher is
    held on a lock the closing thread holds (as a collection on a thread inside ``ThreadPoolExecutor.submit`` holds
    ``concurrent.futures``' global lock, which the dispatcher's own submit needs): the end used to wait 60 s for the
    dispatcher, then warn."""
    from zephon.engine.runners import ThreadRunner

    gate, real = threading.Lock(), ThreadRunner.submit

    def gated(self, ptrs):
        with gate:
            return real(self, ptrs)

    L = _loader(docs, tokenizer_path, "threads")
    it = iter(L)
    next(it)
    monkeypatch.setattr(ThreadRunner, "submit", gated)
    with gate:
        L._dispatcher.poke()
        time.sleep(0.2)  # the dispatcher reaches the gate (it submits the next units)
        t = time.monotonic()
        it.close()
        took = time.monotonic() - t
    assert took < 5, f"the iteration's end waited {took:.1f} s for its threads"
    dispatcher = L._dispatcher
    L.close()  # waits for them
    assert L._dispatcher is None and not dispatcher.thread.is_alive()
