"""zephon_streaming under a plain torch DataLoader whose batch_size is not the dataset's (issue 15, item 3).

Each DataLoader worker yields whole steps of the dataset's ``batch_size`` samples and torch takes each batch from one
worker in turn. With ``num_workers >= 2`` and another batch size, batches mix steps of different workers, and a
checkpoint (counted in steps) repeats some samples and loses others with no message. Now refused, naming both
numbers. Oracle: the sample ids of one uninterrupted epoch iterated in this process, counted here.
"""
from __future__ import annotations

import json
import multiprocessing
from collections import Counter

import pytest

torch = pytest.importorskip("torch")

from torch.utils.data import DataLoader  # noqa: E402

import zephon_streaming.iteration as iteration  # noqa: E402
from zephon_streaming import StreamingDataset  # noqa: E402

BS = 8
pytestmark = pytest.mark.skipif("fork" not in multiprocessing.get_all_start_methods(),
                                reason="the test's monkeypatch reaches DataLoader workers by fork")


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    d = tmp_path_factory.mktemp("mismatch") / "train"
    d.mkdir()
    with open(d / "part-0.jsonl", "w") as f:
        for k in range(160):
            f.write(json.dumps({"id": k, "text": f"sample {k}"}) + "\n")
    return str(d.parent)


def make(data):
    return StreamingDataset(local=data, split="train", batch_size=BS, shuffle=True, shuffle_seed=5, chunk_size=4)


def loader(ds, batch_size, workers):
    kw = {"multiprocessing_context": "fork"} if workers else {}
    return DataLoader(ds, batch_size=batch_size, num_workers=workers, **kw)


def ids(batch) -> list[int]:
    return [int(i) for i in batch["id"]]


def epoch_ids(data) -> Counter:
    """One uninterrupted epoch, iterated in this process (no DataLoader)."""
    return Counter(int(s["id"]) for s in make(data))


def resume_counts(data, batch_size, workers, consumed_batches=1):
    """Consume ``consumed_batches`` batches, checkpoint as Composer does (samples so far, from the beginning), resume
    with a well-formed single-process DataLoader to the end of the epoch: the ids delivered, counted."""
    ds = make(data)
    it = iter(loader(ds, batch_size, workers))
    seen = Counter()
    for _ in range(consumed_batches):
        seen.update(ids(next(it)))
    state = json.loads(json.dumps(ds.state_dict(sum(seen.values()), True)))
    del it
    ds2 = make(data)
    ds2.load_state_dict(state)
    for b in loader(ds2, BS, 0):
        seen.update(ids(b))
    return seen


@pytest.mark.parametrize("batch_size, given", [(16, "batch_size=16"), (4, "batch_size=4"),
                                               (None, "batch_size=None")])
def test_dataloader_batch_size_other_than_the_datasets_is_refused(data, batch_size, given):
    with pytest.raises(ValueError) as ei:
        next(iter(loader(make(data), batch_size, 2)))
    msg = str(ei.value)
    assert f"torch DataLoader {given}" in msg
    assert f"differs from the StreamingDataset's batch_size={BS}" in msg
    assert "num_workers=2" in msg and "DataLoader(dataset, batch_size=dataset.batch_size)" in msg


def test_without_the_check_a_resume_repeats_8_and_loses_8(data, monkeypatch):
    """What today's main did (the check switched off here): batch 0 = steps 0 and 2 of worker 0, the state says
    "2 steps", so the resume repeats step 2 and never delivers step 1."""
    monkeypatch.setattr(iteration, "check_host_batch", lambda *a: None)
    want = epoch_ids(data)
    got = resume_counts(data, 16, 2)
    repeated = sum(n - want[k] for k, n in got.items() if n > want[k])
    lost = sum(n - got[k] for k, n in want.items() if got[k] < n)
    assert (repeated, lost) == (BS, BS)


@pytest.mark.parametrize("batch_size, workers", [(BS, 2), (16, 0), (16, 1)])
def test_allowed_combinations_resume_exactly_once(data, batch_size, workers):
    """The dataset's own batch size at any worker count, or any batch size without parallel workers (one process
    yields every step in order): the resume delivers the epoch's samples exactly once."""
    assert resume_counts(data, batch_size, workers, consumed_batches=2) == epoch_ids(data)
