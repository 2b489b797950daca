"""zephon_torch DataLoaders with a ``collate_fn``: torch's default spelled out is no collate_fn; a user's
collate_fn gets one local micro-batch's samples (one dict per row) and its result is what the loop receives,
while the rank checkpoint stays exact.

Oracle: the same loader without ``collate_fn`` (itself checked against the core ``Loader`` in
test_torch_adapter.py), and an uninterrupted run for the resumed one, compared by row identity.
"""
from __future__ import annotations

import hashlib
from collections import Counter

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("torchdata")

import numpy as np  # noqa: E402
import torch.utils.data._utils.collate as torch_collate  # noqa: E402
import zephon_torch  # noqa: E402
from torch_jobs import R, consume, make_dataset, rows_of  # noqa: E402

STEPS = 6
MICRO = 2  # micro-batches per step (micro_batch 1, 2 rows per lane and step)


@pytest.fixture(scope="module")
def dirs(corpus):
    return [corpus["docs_jsonl"], corpus["code_jsonl"]]


def row_id(row: dict) -> str:
    """A sample's identity: its tokens, labels and positions (as the core's int32)."""
    raw = b"".join(row[f].numpy().astype(np.int32).tobytes() for f in ("input_ids", "labels", "position_ids"))
    return hashlib.sha256(raw).hexdigest()[:16]


def batch_ids(batch: dict) -> list[str]:
    """The row identities of a default (no collate_fn) local micro-batch."""
    return [row_id({f: batch[f][i] for f in ("input_ids", "labels", "position_ids")})
            for i in range(len(batch["__lane__"]))]


def text_collate(rows):
    """A user collate returning a dict that is not a tensor batch."""
    return {"text": [row_id(r) for r in rows], "n": len(rows)}


def tuple_collate(rows):
    """A user collate returning an object the adapter cannot attach metadata to."""
    return tuple(row_id(r) for r in rows), len(rows)


def ids_of(out) -> list[str]:
    return out["text"] if isinstance(out, dict) else list(out[0])


def take(dl, until_step: int, *, stop_at=None):
    """Iterate ``dl`` (a user collate) to the end of step ``until_step - 1`` or after (step, micro) ``stop_at``:
    [(step, micro, ids)], read from the loader's envelope."""
    got = []
    for out in dl:
        info = dl.batch_info
        got.append((info["__step__"], info["__micro__"], ids_of(out)))
        if (info["__step__"], info["__micro__"]) in (stop_at, (until_step - 1, MICRO - 1)):
            break
    return got


@pytest.mark.contract("torch.dataloader")
@pytest.mark.parametrize("fn", [torch.utils.data.default_collate, torch_collate.default_collate],
                         ids=["public", "_utils"])
@pytest.mark.parametrize("cls", ["DataLoader", "StatefulDataLoader"])
@pytest.mark.parametrize("num_workers", [0, 2])
def test_default_collate_spelled_out_is_no_collate_fn(dirs, tokenizer_path, fn, cls, num_workers):
    Loader = getattr(zephon_torch, cls)
    runs = []
    for kwargs in ({}, {"collate_fn": fn}):
        dl = Loader(make_dataset(dirs, tokenizer_path, dp=2, rank=1), num_workers=num_workers, **kwargs)
        batches = []
        for b in dl:
            batches.append(b)
            if (b["__step__"], b["__micro__"]) == (2, 0):  # mid-step
                break
        runs.append((batches, dl.state_dict()))
    (plain, plain_state), (spelled, spelled_state) = runs
    assert len(spelled) == len(plain) == 5
    for a, b in zip(plain, spelled):
        assert set(a) == set(b)
        assert rows_of(a) == rows_of(b)
        assert torch.equal(a["__lane__"], b["__lane__"]) and a["__micro__"] == b["__micro__"]
    assert spelled_state == plain_state
    assert {e["delivered_rows"] for e in spelled_state["lanes"]} == {5}


@pytest.mark.contract("torch.dataloader")
@pytest.mark.parametrize("num_workers", [0, 2])
def test_user_collate_gets_the_rows_and_its_outputs_arrive_in_order(dirs, tokenizer_path, num_workers):
    plain = zephon_torch.DataLoader(make_dataset(dirs, tokenizer_path, dp=1, rank=0), num_workers=num_workers)
    expected = []
    for b in plain:
        expected.append((b["__step__"], b["__micro__"], batch_ids(b), b["__lane__"].tolist()))
        if len(expected) == 3 * MICRO:
            break
    calls = []

    def collate(rows):
        calls.append(rows)
        return text_collate(rows)

    dl = zephon_torch.DataLoader(make_dataset(dirs, tokenizer_path, dp=1, rank=0), num_workers=num_workers,
                                 collate_fn=collate)
    got = []
    for out in dl:
        got.append(out)
        if len(got) == 3 * MICRO:
            break
    assert len(calls) == len(got)
    rows = calls[0]
    assert isinstance(rows, list) and len(rows) == R  # one row per lane (micro_batch 1, one rank)
    assert all(isinstance(r, dict) and not any(k.startswith("__") and k != "__src__" for k in r) for r in rows)
    assert rows[0]["input_ids"].shape == (128,) and rows[0]["input_ids"].dtype == torch.long
    for out, (step, micro, ids, lanes) in zip(got, expected):
        assert out["text"] == ids and out["n"] == R  # the user's result, rows as the default batch has them
        assert (out["__step__"], out["__micro__"], out["__lane__"].tolist()) == (step, micro, lanes)
        assert set(out) == {"text", "n", "__lane__", "__step__", "__micro__"}
    assert dl.state_dict()["step"] == 3


@pytest.mark.contract("torch.stateful")
@pytest.mark.parametrize("collate", [text_collate, tuple_collate], ids=["dict", "tuple"])
@pytest.mark.parametrize("save_workers,resume_workers", [(2, 0), (0, 3)])
def test_mid_epoch_checkpoint_with_user_collate_loses_and_repeats_nothing(dirs, tokenizer_path, collate,
                                                                          save_workers, resume_workers):
    def loader(nw):
        return zephon_torch.StatefulDataLoader(make_dataset(dirs, tokenizer_path, dp=1, rank=0), num_workers=nw,
                                               collate_fn=collate)

    whole = take(loader(2), STEPS)
    assert [(s, j) for s, j, _ in whole] == [(s, j) for s in range(STEPS) for j in range(MICRO)]
    first = loader(save_workers)
    before = take(first, STEPS, stop_at=(2, 0))  # workers prefetched beyond this: it must not count
    state = first.state_dict()
    assert {e["delivered_rows"] for e in state["lanes"]} == {5}
    second = loader(resume_workers)
    second.load_state_dict(state)
    after = take(second, STEPS)
    assert (after[0][0], after[0][1]) == (2, 1)
    ids = [i for _, _, b in before + after for i in b]
    assert Counter(ids) == Counter(i for _, _, b in whole for i in b)  # no sample lost or repeated
    assert before + after == whole  # and in the same order
    plain = zephon_torch.StatefulDataLoader(make_dataset(dirs, tokenizer_path, dp=1, rank=0), num_workers=0)
    consume(plain, STEPS, MICRO)
    assert second.state_dict() == plain.state_dict()  # the user's collate does not change the checkpoint


@pytest.mark.contract("torch.stateful")
def test_a_failing_user_collate_loses_nothing(dirs, tokenizer_path):
    """The user's collate runs before its local micro-batch counts as consumed."""
    def flaky(rows):
        flaky.calls += 1
        if flaky.calls == 3:
            raise RuntimeError("user collate failed")
        return text_collate(rows)

    flaky.calls = 0
    dl = zephon_torch.DataLoader(make_dataset(dirs, tokenizer_path, dp=1, rank=0), num_workers=0, collate_fn=flaky)
    got = []
    with pytest.raises(RuntimeError, match="user collate failed"):
        for out in dl:
            got.append(out["text"])
    assert len(got) == 2
    state = dl.state_dict()
    assert {e["delivered_rows"] for e in state["lanes"]} == {2}  # step 0 only: (1, 0) was not handed out
    whole = take(zephon_torch.DataLoader(make_dataset(dirs, tokenizer_path, dp=1, rank=0), num_workers=0,
                                         collate_fn=text_collate), 2)
    again = zephon_torch.DataLoader(make_dataset(dirs, tokenizer_path, dp=1, rank=0), num_workers=0,
                                    collate_fn=text_collate)
    again.load_state_dict(state)
    assert got + [ids for _, _, ids in take(again, 2)] == [ids for _, _, ids in whole]
