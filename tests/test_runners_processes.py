"""The ``processes`` runner: output identical to ``inline``; workers that die with their parent (SIGKILL,
also from inside a torch DataLoader worker); a killed or crashing worker replaced with nothing lost or
repeated, or a clear ``WorkerDied``; large arrays through shared memory without leaks.

``python tests/test_runners_processes.py`` prints the transport measurement (pickle vs shared memory).
"""
from __future__ import annotations

import gc
import hashlib
import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
import zlib
from pathlib import Path

import numpy as np
import psutil
import pytest

from zephon.engine import Loader, shm
from zephon.engine.runners import ProcessRunner, WorkerDied
from zephon.formats import open_dataset
from zephon.ops import Batch, Decode, Map

N_DOCS = 240
IMAGE = (96, 96, 3)  # 110,592 bytes of float32: above the shared-memory threshold
ROOT = Path(__file__).resolve().parents[1]


def with_image(r):
    """A deterministic 'decoded image' per sample (seeded by its text), plus an id."""
    rng = np.random.default_rng(zlib.crc32(r["text"].encode()))
    return {"text": r["text"], "image": rng.random(IMAGE, dtype=np.float32)}


def slow_image(r):
    time.sleep(0.01)
    return with_image(r)


def exit_once(r):
    """Kill the worker (``os._exit``) the first time it reaches doc 50 (a flag file records it)."""
    flag = os.environ["ZEPHON_TEST_FLAG"]
    if r["text"] == "doc 50" and not os.path.exists(flag):
        Path(flag).write_text("died")
        os._exit(3)
    return with_image(r)


def exit_always(r):
    """A poison sample: every worker that reads doc 7 dies."""
    if r["text"] == "doc 7":
        os._exit(7)
    return r


@pytest.fixture(scope="module")
def jsonl(tmp_path_factory):
    d = tmp_path_factory.mktemp("runner_data")
    with open(d / "docs.jsonl", "w") as f:
        for i in range(N_DOCS):
            f.write(json.dumps({"text": f"doc {i}"}) + "\n")
    return d


def make(jsonl, runner, fn=with_image, num_workers=2):
    return Loader([open_dataset(jsonl)], [Decode("text"), Map(fn, name="image"), Batch(4)], runner=runner,
                  num_workers=num_workers, canonical_replicas=2, chunk_size=16, unit_size=8, exhaustion="stop",
                  seed=3)


def identities(loader) -> list:
    """(lane, step, text, sha256 of the image bytes) of every delivered row, in delivery order."""
    out = []
    for mb in loader:
        for i, text in enumerate(mb["text"]):
            out.append((mb["__lane__"], mb["__step__"], text, hashlib.sha256(mb["image"][i].tobytes()).hexdigest()))
    return out


@pytest.fixture(scope="module")
def reference(jsonl):
    """The oracle: one uninterrupted inline run."""
    with make(jsonl, "inline") as L:
        ids = identities(L)
    assert sorted(int(t.split()[1]) for _, _, t, _ in ids) == list(range(N_DOCS))  # every doc exactly once
    return ids


def shm_fds() -> int:
    return len(os.listdir("/proc/self/fd")) if os.path.isdir("/proc/self/fd") else 0


def dev_shm() -> set:
    """Named shared memory: what a runner could leak. The host side channel's directories (``zephon-streaming-*``,
    made by other tests running at the same time) are not the runner's."""
    names = os.listdir("/dev/shm") if os.path.isdir("/dev/shm") else []
    return {n for n in names if not n.startswith("zephon-streaming-")}


def test_processes_output_identical_to_inline_and_nothing_leaks(jsonl, reference):
    before_shm, before_fds = dev_shm(), shm_fds()
    runner = ProcessRunner(make(jsonl, "inline").stage, 2)
    pids = runner.pids
    try:
        with make(jsonl, runner) as L:
            assert identities(L) == reference
    finally:
        runner.close()
    gc.collect()
    assert dev_shm() - before_shm == set()
    assert shm_fds() <= before_fds  # every received shared-memory descriptor was closed
    assert len(pids) == 2 and not _alive([psutil.Process(p) for p in pids if psutil.pid_exists(p)])


def test_a_second_close_from_another_thread_waits_for_the_workers_too(jsonl):
    """Two threads close one runner (``close()`` from a monitor beside an iteration's own cleanup): the second
    returns only once the workers are gone too, not at once because the first already began (it did)."""
    runner = ProcessRunner(make(jsonl, "inline").stage, 1)
    pids, gate, real = runner.pids, threading.Event(), runner._shutdown

    def held_shutdown():  # the first close() is still stopping the workers while the second is called
        gate.wait(60)
        real()

    runner._shutdown = held_shutdown
    first = threading.Thread(target=runner.close)
    first.start()
    deadline = time.monotonic() + 60
    while not runner._closing and time.monotonic() < deadline:
        time.sleep(0.01)
    threading.Timer(0.3, gate.set).start()
    runner.close()
    assert not runner._thread.is_alive(), "the second close() returned while the first was still stopping workers"
    assert not _alive([psutil.Process(p) for p in pids if psutil.pid_exists(p)])
    first.join(60)


def test_arrays_travel_in_shared_memory_as_views(jsonl):
    template = make(jsonl, "inline")
    ptrs = template.source.chunk(0, 0).slice(0, 4)
    expect = template.stage.run(ptrs).records
    for threshold, mapped in ((64 * 1024, True), (None, False)):
        r = ProcessRunner(template.stage, 1, shm_threshold=threshold)
        try:
            got = r.submit(ptrs).result(timeout=60).records
        finally:
            r.close()
        assert [g["text"] for g in got] == [e["text"] for e in expect]
        for g, e in zip(got, expect):
            assert g["image"].dtype == e["image"].dtype and np.array_equal(g["image"], e["image"])
            base = g["image"]
            while getattr(base, "base", None) is not None and not isinstance(base, memoryview):
                base = base.base
            assert (type(base).__name__ == "mmap") == mapped, (threshold, type(base))
            g["image"][0, 0, 0] = -1.0  # a private, writable array either way
        del got


@pytest.mark.skipif(not shm.available(), reason="no memfd_create on this platform: results are pickled")
def test_shm_pack_round_trip_keeps_values_dtypes_and_nesting():
    recs = [{"t": np.arange(40000).astype("datetime64[s]")[::2], "n": [np.ones((200, 200), bool).T, (np.zeros(3),)],
             "be": np.arange(90000, dtype=">f8").reshape(300, 300), "s": "text", "small": np.arange(4)}]
    packed, fd, size = shm.pack(recs, threshold=1000)
    assert isinstance(packed[0]["t"], shm.ArrayRef) and isinstance(packed[0]["n"][0], shm.ArrayRef)
    assert type(packed[0]["small"]) is np.ndarray and isinstance(packed[0]["n"][1][0], np.ndarray)  # below threshold
    assert recs[0]["t"].base is not None and type(recs[0]["n"][0]) is np.ndarray  # the input is left untouched
    out = shm.unpack(packed, fd, size)
    for k in ("t", "be", "small"):
        assert out[0][k].dtype == recs[0][k].dtype and np.array_equal(out[0][k], recs[0][k])
    assert np.array_equal(out[0]["n"][0], recs[0]["n"][0]) and out[0]["s"] == "text"
    assert shm.pack([{"x": np.zeros(3)}], threshold=1000)[1] is None  # nothing large: no file at all


def _kill_a_busy_worker(runner, after_rows, rows, killed) -> None:
    """From a side thread: once ``rows`` holds ``after_rows`` rows, SIGKILL the first worker seen holding a unit
    (so its death must re-run work); record its pid in ``killed``. Gives up after 60 s."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and not killed:
        if len(rows) >= after_rows:
            with runner._lock:
                busy = [w.pid for w in runner._workers if w.outstanding]
            if busy:
                os.kill(busy[0], signal.SIGKILL)
                killed.append(busy[0])
                return
        time.sleep(0.0005)


@pytest.mark.slow  # covered: test_worker_exiting_inside_an_operator_is_replaced (a dead worker's unit re-run)
def test_killed_worker_is_replaced_and_nothing_is_lost_or_repeated(jsonl, reference):
    template = make(jsonl, "inline", fn=slow_image)
    runner = ProcessRunner(template.stage, 2)
    out, killed = [], []
    killer = threading.Thread(target=_kill_a_busy_worker, args=(runner, 8, out, killed), daemon=True)
    try:
        with make(jsonl, runner, fn=slow_image) as L:
            killer.start()
            for mb in L:
                out.extend((mb["__lane__"], mb["__step__"], t, hashlib.sha256(mb["image"][i].tobytes()).hexdigest())
                           for i, t in enumerate(mb["text"]))
            assert out == reference
        killer.join(5)
        assert killed, "no worker held a unit while the test iterated: nothing was killed"
        assert [pid for pid, *_ in runner.deaths] == killed
        assert runner.deaths[0][1] == -signal.SIGKILL and runner.deaths[0][2] >= 1  # it held units: re-run
        assert runner.restarts == 1 and killed[0] not in runner.pids and len(runner.pids) == 2
    finally:
        runner.close()


def test_worker_exiting_inside_an_operator_is_replaced(jsonl, reference, tmp_path, monkeypatch):
    monkeypatch.setenv("ZEPHON_TEST_FLAG", str(tmp_path / "flag"))
    runner = ProcessRunner(make(jsonl, "inline", fn=exit_once).stage, 2)
    try:
        with make(jsonl, runner, fn=exit_once) as L:
            assert identities(L) == reference
        assert (tmp_path / "flag").exists() and runner.restarts == 1 and runner.deaths[0][1] == 3
    finally:
        runner.close()


def test_a_unit_that_kills_every_worker_raises_naming_worker_and_sample(jsonl):
    with make(jsonl, "processes", fn=exit_always) as L:
        t0 = time.monotonic()
        with pytest.raises(WorkerDied) as e:
            for _ in L:
                pass
    msg = str(e.value)
    assert "worker pid" in msg and "exited with code 7" in msg and "max_restarts=3" in msg
    assert "docs.jsonl" in msg and "sample" in msg
    assert time.monotonic() - t0 < 120  # never a hang


def test_unpicklable_operator_is_refused_at_start(jsonl):
    L = Loader([open_dataset(jsonl)], [Decode("text"), Map(lambda r: r), Batch(4)], runner="processes",
               canonical_replicas=2, chunk_size=16)
    with pytest.raises(Exception, match=r"module-level def, not a lambda.*operators on workers: decode, map"):
        next(iter(L))
    L.close()


# -- orphans ---------------------------------------------------------------------------------------
PARENT = """
import sys, time
from zephon.engine import Loader, shm
from zephon.formats import open_dataset
from zephon.ops import Batch, Decode

if __name__ == "__main__":
    mode, data = sys.argv[1], sys.argv[2]
    ops = [Decode("text"), Batch(4)]
    if mode == "loader":
        L = Loader([open_dataset(data)], ops, runner="processes", num_workers=2, canonical_replicas=2,
                   chunk_size=16, unit_size=8)
        it = iter(L)
    else:  # a torch DataLoader worker that starts the processes runner
        import torch
        from zephon_torch import ZephonIterableDataset
        ds = ZephonIterableDataset([open_dataset(data)], ops, dp_degree=1, dp_rank=0, worker_runner="processes",
                                   worker_num_workers=2, canonical_replicas=2, chunk_size=16, unit_size=8)
        it = iter(torch.utils.data.DataLoader(ds, batch_size=None, num_workers=1))
    for _ in range(5):
        next(it)
    print("ready", flush=True)
    while True:
        next(it)
        time.sleep(0.05)
"""


def _descendants(pid: int, expect: int, timeout: float = 60) -> list:
    """The process tree under ``pid`` once it has at least ``expect`` members."""
    deadline = time.monotonic() + timeout
    while True:
        kids = psutil.Process(pid).children(recursive=True)
        if len(kids) >= expect or time.monotonic() > deadline:
            return kids
        time.sleep(0.2)


def _alive(procs) -> list:
    out = []
    for p in procs:
        try:
            if p.is_running() and p.status() != psutil.STATUS_ZOMBIE:
                out.append(p)
        except psutil.NoSuchProcess:
            pass
    return out


@pytest.mark.parametrize("mode, expect", [("loader", 2), ("torch", 3)])
def test_no_worker_survives_its_parent_killed(jsonl, tmp_path, mode, expect):
    script = tmp_path / "parent.py"
    script.write_text(textwrap.dedent(PARENT))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), str(ROOT / "adapters")]))
    parent = subprocess.Popen([sys.executable, str(script), mode, str(jsonl)], stdout=subprocess.PIPE, env=env,
                              start_new_session=True)
    kids = []
    try:
        line = parent.stdout.readline()
        assert line.strip() == b"ready", f"the parent did not start (exit code {parent.poll()})"
        kids = _descendants(parent.pid, expect)
        assert len(kids) >= expect, [k.cmdline() for k in kids]
        assert not [k for k in kids if "resource_tracker" in " ".join(k.cmdline())]  # nothing to outlive us
        parent.send_signal(signal.SIGKILL)
        parent.wait()
        deadline = time.monotonic() + 10
        while _alive(kids) and time.monotonic() < deadline:
            time.sleep(0.2)
        left = _alive(kids)
        assert not left, f"orphans 10 s after the parent's SIGKILL: {[(p.pid, p.cmdline()[:3]) for p in left]}"
    finally:
        parent.kill()
        parent.wait()
        for p in _alive(kids):
            p.kill()
