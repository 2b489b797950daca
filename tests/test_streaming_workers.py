"""zephon_streaming under a plain ``torch.utils.data.DataLoader(ds, batch_size=ds.batch_size, num_workers=W)``.

torch collates ``batch_size`` consecutive samples of one worker, so each worker must yield whole rank batches; the
step exchange (``zephon.host.exchange``) gives it those while each worker computes only its share of the lanes.

Oracles, computed without the code under test's own claims:
- the rank batches of an uninterrupted core ``zephon.Loader`` over the same files (the documented keyword mapping:
  lanes = ``num_canonical_nodes``, global batch = ``batch_size`` x ranks, one lane step = one micro-batch), and of
  a single-process iteration of the dataset (no workers), cut into batches here;
- the work: every lane micro-batch any process's core ``Loader`` yields is logged by a wrapper installed on
  ``zephon.Loader.__iter__`` in this process before the workers fork (so it runs in them), one line per micro-batch
  with its process, lane and step. No duplicated work means each (lane, step) exactly once per epoch;
- bounded disk: the exchange files present while iterating, counted by listing the dataset's private directory.
"""
from __future__ import annotations

import hashlib
import json
import multiprocessing
import os
import time
from collections import Counter

import pytest

torch = pytest.importorskip("torch")

from torch.utils.data import DataLoader  # noqa: E402

import zephon  # noqa: E402
from zephon import Batch, Loader, open_dataset  # noqa: E402
from zephon_streaming import StreamingDataset  # noqa: E402

from helpers import deadline  # noqa: E402

GBS, CHUNK, LANES = 16, 4, 16          # 16 lanes (num_canonical_nodes defaults to the global batch), 1 row each
pytestmark = pytest.mark.skipif("fork" not in multiprocessing.get_all_start_methods(),
                                reason="the work counter reaches DataLoader workers by fork")


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    root = tmp_path_factory.mktemp("workers")
    d = root / "a" / "train"
    d.mkdir(parents=True)
    for s in range(3):
        with open(d / f"part-{s}.jsonl", "w") as f:
            for i in range(120):
                k = s * 120 + i
                f.write(json.dumps({"id": k, "text": f"sample {k}: " + "xyz " * (k % 5)}) + "\n")
    return str(root / "a")


@pytest.fixture
def work_log(tmp_path, monkeypatch):
    """Log every lane micro-batch a core Loader yields, in any process forked after this: (pid, lane, step)."""
    path = tmp_path / "work.log"
    path.write_text("")
    inner = Loader.__iter__

    def logged(self):
        for mb in inner(self):
            with open(path, "a") as f:
                f.write(f"{os.getpid()} {mb['__lane__']} {mb['__step__']}\n")
            yield mb

    monkeypatch.setattr(zephon.Loader, "__iter__", logged)

    def read(clear=True):
        rows = [tuple(int(x) for x in line.split()) for line in path.read_text().splitlines()]
        if clear:
            path.write_text("")
        return rows
    return read


def make(data, **kw):
    kw.setdefault("shuffle", True)
    return StreamingDataset(local=data, split="train", batch_size=GBS, shuffle_seed=17, chunk_size=CHUNK, **kw)


def loader(ds, workers, **kw):
    if workers:
        kw.setdefault("multiprocessing_context", "fork")
    return DataLoader(ds, batch_size=ds.batch_size, num_workers=workers, **kw)


def digest(batch) -> str:
    return hashlib.sha256(json.dumps([batch["id"].tolist(), list(batch["text"])]).encode()).hexdigest()


def rows_digest(rows) -> str:
    return hashlib.sha256(json.dumps([[r[0] for r in rows], [r[1] for r in rows]]).encode()).hexdigest()


def single_process(ds, epochs=2):
    """Rank batches per epoch of the dataset iterated in this process, cut into batches of GBS here."""
    out = []
    for _ in range(epochs):
        rows = [(int(s["id"]), s["text"]) for s in ds]
        out.append([rows_digest(rows[i:i + GBS]) for i in range(0, len(rows), GBS)])
    return out


def core_batches(data, steps):
    """The first epoch of an unshuffled dataset from the core Loader alone: step k = its lanes' micro-batches in
    lane order."""
    L = Loader([open_dataset(os.path.join(data, "train"))], [Batch(GBS // LANES, drop_last=True)], seed=17,
               canonical_replicas=LANES, chunk_size=CHUNK, global_batch_size=GBS, shuffle=False, exhaustion="fill",
               runner="inline")
    by_step: dict[int, list] = {}
    for mb in L:
        by_step.setdefault(mb["__step__"], []).extend(zip((int(i) for i in mb["id"]), mb["text"]))
        if len(by_step) > steps:
            break
    return [rows_digest(by_step[k]) for k in range(steps)]


def check_work(log, steps, lanes=LANES, first_step=0, workers=None):
    """Each (lane, step) of the epoch computed exactly once, by ``workers`` distinct processes at most."""
    pairs = Counter((lane, step) for _, lane, step in log)
    assert len(log) == steps * lanes, f"{len(log)} lane micro-batches computed for {steps} steps x {lanes} lanes"
    assert set(pairs) == {(lane, k) for lane in range(lanes) for k in range(first_step, first_step + steps)}
    assert max(pairs.values()) == 1, "a lane micro-batch was computed twice"
    procs = Counter(pid for pid, _, _ in log)
    if workers is not None:
        assert 1 < len(procs) <= workers, procs  # the work is spread over the workers, each lane in one
    return procs


# -- whole rank batches, no duplicated work ---------------------------------------------------------
@pytest.mark.contract("streaming.dataloader")
@pytest.mark.parametrize("workers", [0, 1, 2, 3])
def test_plain_dataloader_gives_the_core_batches_computing_each_lane_once(data, work_log, workers):
    ds = make(data, shuffle=False)
    S = ds.steps_per_epoch
    want = core_batches(data, S)
    work_log()
    with deadline(120, "the DataLoader workers are stuck"):
        got = [digest(b) for b in loader(ds, workers)]
    assert got == want
    check_work(work_log(), S, workers=workers if workers >= 2 else None)


@pytest.mark.contract("streaming.dataloader", "streaming.epochs")
@pytest.mark.parametrize("workers", [2, 3])
def test_shuffled_epochs_match_the_single_process_run(data, work_log, workers):
    ref = single_process(make(data))
    work_log()
    ds = make(data)
    dl = loader(ds, workers, prefetch_factor=3)
    with deadline(180, "the DataLoader workers are stuck"):
        for epoch in range(2):
            assert [digest(b) for b in dl] == ref[epoch], f"epoch {epoch}"
            check_work(work_log(), ds.steps_per_epoch, workers=workers)


@pytest.mark.contract("streaming.resume", "streaming.dataloader")
def test_composer_state_mid_epoch_with_two_workers_resumes_with_three_and_none(data, work_log):
    ref = single_process(make(data))
    ds = make(data)
    it = iter(loader(ds, 2))
    with deadline(120, "the DataLoader workers are stuck"):
        head = [digest(next(it)) for _ in range(7)]
    assert head == ref[0][:7]
    state = json.loads(json.dumps(ds.state_dict(7 * GBS, True)))  # Composer: sample_in_epoch, from the beginning
    del it
    work_log()
    for workers in (3, 0):
        ds2 = make(data)
        ds2.load_state_dict(state)
        with deadline(120, "the DataLoader workers are stuck"):
            rest = [digest(b) for b in loader(ds2, workers)]
            assert rest == ref[0][7:], f"resumed with {workers} workers"
            check_work(work_log(), ds2.steps_per_epoch - 7, first_step=7, workers=workers or None)
            assert [digest(b) for b in loader(ds2, workers)] == ref[1], "the next __iter__ is epoch 1"
        work_log()


# -- torch's dispatch: out of order, persistent workers, early stop; bounded disk -------------------------
@pytest.mark.contract("streaming.dataloader")
def test_out_of_order_delivery_keeps_every_batch_whole(data, work_log):
    ref = single_process(make(data), epochs=1)[0]
    ds = make(data)
    work_log()
    with deadline(120, "the DataLoader workers are stuck"):
        got = [digest(b) for b in loader(ds, 3, in_order=False, prefetch_factor=1)]
    assert sorted(got) == sorted(ref)
    check_work(work_log(), ds.steps_per_epoch, workers=3)


@pytest.mark.contract("streaming.dataloader", "streaming.epochs")
def test_early_stop_with_persistent_workers_then_next_epoch(data, work_log):
    ref = single_process(make(data))
    work_log()
    ds = make(data)
    dl = loader(ds, 2, persistent_workers=True, prefetch_factor=2)
    with deadline(120, "the DataLoader workers are stuck"):
        it = iter(dl)
        assert [digest(next(it)) for _ in range(3)] == ref[0][:3]
        # the training loop stops: the next iter() is epoch 1, on the same worker processes
        assert [digest(b) for b in dl] == ref[1]
    log, S = work_log(), ds.steps_per_epoch
    # epoch 1 whole, plus what epoch 0 computed: steps 0 .. the last task dispatched (3 taken + P x W - 1), and the
    # W - 1 steps its worker computes past it
    assert S * LANES + 3 * LANES <= len(log) <= S * LANES + (3 + 2 * 2 + 2 - 1) * LANES, len(log)
    assert max(Counter((lane, step) for _, lane, step in log).values()) <= 2, "computed twice within an epoch"


@pytest.mark.contract("streaming.dataloader")
def test_early_stop_then_new_workers_and_the_exchange_stays_bounded(data, work_log):
    ref = single_process(make(data))
    ds = make(data)
    xdir = os.path.join(ds._channel.root, "x")
    W, P = 3, 2
    with deadline(120, "the DataLoader workers are stuck"):
        it = iter(loader(ds, W, prefetch_factor=P))
        assert [digest(next(it)) for _ in range(4)] == ref[0][:4]
        del it  # the training loop stops early: torch shuts the workers down
        most = 0
        for k, b in enumerate(loader(ds, W, prefetch_factor=P)):
            assert digest(b) == ref[1][k]
            files = [n for _, _, ns in os.walk(xdir) for n in ns if n.endswith(".pkl")]
            most = max(most, len(files))
    # Files exist only for steps main has not received: torch dispatched at most P x W tasks beyond them, and the
    # worker of a dispatched step computes W - 1 steps past it; each step has at most W - 1 files (its other workers)
    assert most <= (P * W + W - 1) * (W - 1), most
    left = [n for _, _, ns in os.walk(xdir) for n in ns if n.endswith(".pkl")]
    assert left == [], f"exchange files left behind (consumed steps, or the stopped iteration's): {left}"


@pytest.mark.contract("streaming.dataloader")
@pytest.mark.parametrize("in_order", [True, False])
def test_a_paused_training_loop_never_times_the_workers_out(data, in_order):
    """Workers wait for each other only as long as one computes; a training loop that pauses (evaluation, a
    checkpoint) longer than ``exchange_timeout`` is no fault."""
    ref = single_process(make(data), epochs=1)[0]
    ds = make(data, exchange_timeout=0.5)
    it = iter(loader(ds, 3, in_order=in_order, prefetch_factor=1))
    with deadline(120, "the DataLoader workers are stuck"):
        got = [digest(next(it)) for _ in range(2)]
        time.sleep(2.5)
        got += [digest(b) for b in it]
    assert (got if in_order else sorted(got)) == (ref if in_order else sorted(ref))
