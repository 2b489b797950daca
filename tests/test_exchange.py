"""zephon.host.exchange: what a worker waiting for another worker's micro-batches does in each situation.

The other worker is simulated by writing its status and files the way the documented layout says
(``w<worker>.json``, ``s<step>.w<worker>.pkl``), so each case is set up independently of the code under test.
"""
from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys
import threading
import time

import pytest

from zephon.host import StepExchange
from zephon.host.exchange import sweep

LANES = list(range(8))  # two workers: worker 0 computes lanes 0, 2, 4, 6 and worker 1 lanes 1, 3, 5, 7


def status(d, worker, state, pid=None, error=None):
    with open(os.path.join(d, f"w{worker}.json"), "w") as f:
        json.dump({"pid": pid or os.getpid(), "state": state, "step": None, "error": error}, f)


def publish(d, step, worker, items):
    with open(os.path.join(d, f"s{step}.w{worker}.pkl"), "wb") as f:
        pickle.dump(items, f)


def dead_pid() -> int:
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


def test_steps_alternate_between_the_workers(tmp_path):
    ex = StepExchange(str(tmp_path / "it"), LANES, 3, 0, first_step=5)
    assert [ex.owner(k) for k in range(5, 11)] == [0, 1, 2, 0, 1, 2]


def test_a_busy_worker_that_publishes_nothing_times_out_naming_what_was_awaited(tmp_path):
    d = str(tmp_path / "it")
    ex = StepExchange(d, LANES, 2, 0, first_step=0, timeout=0.3)
    status(d, 1, "busy")
    t = time.monotonic()
    with pytest.raises(TimeoutError) as e:
        ex.collect(4)
    assert 0.3 <= time.monotonic() - t < 5
    msg = str(e.value)
    for part in ("worker 0 waited", "worker 1", f"pid {os.getpid()}", "lanes 1, 3, 5, 7", "step 4", d):
        assert part in msg, (part, msg)


def test_an_idle_worker_is_waited_for_without_timeout_and_its_items_are_collected_once(tmp_path):
    d = str(tmp_path / "it")
    ex = StepExchange(d, LANES, 2, 0, first_step=0, timeout=0.2)
    status(d, 1, "idle")  # waits for the host to send it a task: the training loop's pace, not a fault
    items = [({"lane": 1, "step": 2, "micro": 0}, {"x": [1]})]
    threading.Timer(1.0, publish, (d, 2, 1, items)).start()
    assert ex.collect(2) == items
    assert not os.path.exists(os.path.join(d, "s2.w1.pkl")), "a collected file is removed"


@pytest.mark.parametrize("state,error,fragment", [
    ("failed", "DataError: shard part-3.jsonl line 7", "failed (DataError: shard part-3.jsonl line 7)"),
    ("left", None, "is left"),
    ("done", None, "is done"),
])
def test_a_worker_that_ends_without_publishing_is_reported_at_once(tmp_path, state, error, fragment):
    d = str(tmp_path / "it")
    ex = StepExchange(d, LANES, 2, 0, first_step=0, timeout=60)
    status(d, 1, state, error=error)
    t = time.monotonic()
    with pytest.raises(RuntimeError, match="worker 1") as e:
        ex.collect(6)
    assert time.monotonic() - t < 5 and fragment in str(e.value) and "step 6" in str(e.value)


def test_an_exited_worker_is_reported_and_one_that_published_first_is_not(tmp_path):
    d = str(tmp_path / "it")
    ex = StepExchange(d, LANES, 2, 0, first_step=0, timeout=60)
    status(d, 1, "busy", pid=dead_pid())
    with pytest.raises(RuntimeError, match="exited"):
        ex.collect(1)
    items = [({"lane": 1, "step": 3, "micro": 0}, None)]
    publish(d, 3, 1, items)
    assert ex.collect(3) == items


def test_sweep_removes_only_finished_or_abandoned_iterations(tmp_path):
    parent = tmp_path / "x"
    for name, states in {"over": [("done", None), ("left", None)], "dead": [("busy", dead_pid())],
                         "live": [("idle", None), ("done", None)], "new": []}.items():
        d = parent / name
        d.mkdir(parents=True)
        publish(str(d), 0, 1, [])
        for w, (state, pid) in enumerate(states):
            status(str(d), w, state, pid=pid)
    (parent / "mine").mkdir()
    sweep(str(parent), keep="mine")
    assert sorted(os.listdir(parent)) == ["live", "mine", "new"]


def test_items_published_just_before_the_worker_finished_are_collected(tmp_path, monkeypatch):
    """The race: the first look finds no file, the worker publishes and writes ``done``, the status is read."""
    d = str(tmp_path / "it")
    ex = StepExchange(d, LANES, 2, 0, first_step=0, timeout=60)
    items = [({"lane": 1, "step": 3, "micro": 0}, {"x": [3]})]
    read_status, published = ex._status, []

    def finish_then_read(worker):
        if not published:  # the other worker publishes once, between the two looks
            publish(d, 3, 1, items)
            status(d, 1, "done")
            published.append(True)
        return read_status(worker)

    monkeypatch.setattr(ex, "_status", finish_then_read)
    assert ex.collect(3) == items
