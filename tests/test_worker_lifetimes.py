"""Worker processes belong to the iteration that started them: an exhausted, closed, failed or abandoned
iterator leaves no worker process behind, nor does a Loader left to the garbage collector."""
from __future__ import annotations

import gc
import json
import os
import time

import pytest

from zephon import Batch, DataError, Decode, Loader, Map, open_dataset


def _children() -> list[int]:
    """Pids of this process's live (not zombie) children, counted by the OS, not by zephon."""
    try:
        import psutil
        return [p.pid for p in psutil.Process().children(recursive=True) if p.status() != psutil.STATUS_ZOMBIE]
    except ImportError:
        me, out = str(os.getpid()), []
        for d in os.listdir("/proc"):
            if d.isdigit():
                try:
                    fields = open(f"/proc/{d}/stat").read().rsplit(")", 1)[1].split()
                except OSError:
                    continue
                if fields[1] == me and fields[0] != "Z":
                    out.append(int(d))
        return out


def _settle(expected: int, timeout: float = 10.0) -> list[int]:
    """The children once their number drops to ``expected`` (or the timeout passes: the test then fails)."""
    end = time.monotonic() + timeout
    while True:
        kids = _children()
        if len(kids) <= expected or time.monotonic() > end:
            return kids
        time.sleep(0.1)


def upper(r):
    r["text"] = r["text"].upper()
    return r


def fail_on_seven(r):
    if r["text"].endswith(" 7"):
        raise ValueError("record 7 is poison")
    return r


@pytest.fixture
def data(tmp_path):
    with open(tmp_path / "a.jsonl", "w") as fh:
        for i in range(200):
            fh.write(json.dumps({"text": f"document {i}"}) + "\n")
    return str(tmp_path / "a.jsonl")


def _loader(data, fn=upper, exhaustion="repeat"):
    return Loader([open_dataset(data)], [Decode("text"), Map(fn), Batch(2)], runner="processes", num_workers=2,
                  canonical_replicas=2, chunk_size=16, unit_size=4, exhaustion=exhaustion)


def test_abandoned_loaders_leave_no_worker(data):
    base = len(_settle(0))  # an earlier test's children may still be ending: not counted as ours
    for k in range(20):
        L = _loader(data)
        it = iter(L)
        for _ in range(3 + k % 4):  # partly iterated
            next(it)
        assert len(_children()) >= base + 2  # the workers really were running
        del it, L  # abandoned without close()
        gc.collect()
    left = _settle(base)
    assert len(left) == base, f"{len(left) - base} worker processes left: {left}"


def test_finished_pass_and_failure_stop_workers(data):
    base = len(_settle(0))  # an earlier test's children may still be ending: not counted as ours
    L = _loader(data, exhaustion="stop")
    rows = sum(len(mb["text"]) for mb in L)
    assert rows == 200  # counted in this test: the file has 200 lines
    assert len(_settle(base)) == base  # exhausted: the loader still exists, its workers do not
    L = _loader(data, fn=fail_on_seven)
    with pytest.raises((ValueError, DataError), match="poison"):
        for _ in L:
            pass
    assert len(_settle(base)) == base  # an exception in a Map ended the iteration, and the workers
    with _loader(data) as L:
        next(iter(L))
        it = iter(L)  # a newer iteration takes the workers over
        next(it)
        assert len(_children()) == base + 2
    assert len(_settle(base)) == base


def test_context_manager_and_resume_after_stop(data):
    """A second iteration after the first stopped its workers starts new ones and continues in order."""
    with _loader(data) as L:
        it = iter(L)
        first = [next(it)["text"] for _ in range(5)]
        it.close()
        second = [next(iter(L))["text"]]
    with _loader(data) as ref:
        it = iter(ref)
        expected = [next(it)["text"] for _ in range(6)]
    assert first + second == expected
