"""A finite packed pass gives the same global batches from a bucket (moto, tests/s3_server.py) as from the
identical local copy, for MDS and JSONL, and a checkpoint taken on one resumes the other on the same data.

Oracle: the local copy's own uninterrupted run; the corpora (lognormal document lengths, so a split by size and
a split by count differ) are made here.
"""
from __future__ import annotations

import json
import math
import warnings

import numpy as np
import pytest

LANES, ROW = 2, 64


def texts(n: int = 300) -> list[str]:
    rng = np.random.default_rng(3)
    lengths = np.clip(np.round(rng.lognormal(math.log(40), 1.4, n)), 4, 2000).astype(int).tolist()
    return [f"{i}:" + "".join(chr(97 + (i * 5 + j) % 26) for j in range(k)) for i, k in enumerate(lengths)]


@pytest.fixture(scope="module")
def corpora(tmp_path_factory):
    """{"mds": dir written by streaming's MDSWriter (raw, several shards), "jsonl": dir of two JSONL files}."""
    MDSWriter = pytest.importorskip("streaming").MDSWriter
    root, docs = tmp_path_factory.mktemp("split"), texts()
    with MDSWriter(out=str(root / "mds"), columns={"text": "str"}, size_limit=1 << 12) as w:
        for t in docs:
            w.write({"text": t})
    (root / "jsonl").mkdir()
    for k, part in enumerate((docs[:150], docs[150:])):
        (root / "jsonl" / f"{k}.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in part))
    return {"mds": str(root / "mds"), "jsonl": str(root / "jsonl")}


def loader(url: str, cache: str, drop_last: bool = False):
    from zephon import Batch, Decode, Loader, Pack, Tokenize, open_dataset
    ops = [Decode("text"), Tokenize("bytes", eos_id="<eos>", max_length=ROW), Pack(ROW),
           Batch(micro_batch_size=2, drop_last=drop_last)]
    return Loader([open_dataset(url, name="d", local=cache)], ops, canonical_replicas=LANES, exhaustion="stop",
                  runner="inline")


def rows(batches) -> list:
    return [np.asarray(mb["input_ids"]).tolist() for mb in batches]


def run(url: str, cache: str, state=None, steps=None, drop_last=False) -> tuple[list, dict]:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        L = loader(url, cache, drop_last)
        if state is not None:
            L.restore(state)
        it = iter(L)
        out = [mb for _, mb in zip(range(steps), it)] if steps is not None else list(it)
        return rows(out), json.loads(json.dumps(L.checkpoint()))


@pytest.mark.parametrize("fmt", ["mds", "jsonl"])
def test_bucket_and_local_copy_give_the_same_packed_pass(s3, corpora, fmt, tmp_path):
    """The whole finite packed pass is the same global batches from s3:// (a cold cache, then a warm one) as
    from the local directory; a checkpoint after 5 steps on either resumes the other on the local run's rest."""
    local = corpora[fmt]
    url = s3.upload_dir(local, fmt)
    whole, _ = run(local, str(tmp_path / "unused"))
    assert len(whole) > 10
    cold, _ = run(url, str(tmp_path / "c1"))
    warm, _ = run(url, str(tmp_path / "c1"))
    assert cold == whole
    assert warm == whole
    head, state = run(local, str(tmp_path / "unused"), steps=5)
    rest, _ = run(url, str(tmp_path / "c2"), state=state)
    assert head + rest == whole, "checkpoint from the local copy resumed on the bucket"
    head, state = run(url, str(tmp_path / "c3"), steps=5)
    rest, _ = run(local, str(tmp_path / "unused"), state=state)
    assert head + rest == whole, "checkpoint from the bucket resumed on the local copy"


@pytest.mark.parametrize("fmt", ["mds", "jsonl"])
def test_whole_row_split_is_the_same_from_the_bucket(s3, corpora, fmt, tmp_path):
    """drop_last=True (JSONL: the whole-row split, ALGORITHM_VERSION 4; MDS: the count split): the pass from
    s3:// is the local directory's, batch for batch."""
    local = corpora[fmt]
    url = s3.upload_dir(local, fmt)
    whole, _ = run(local, str(tmp_path / "unused"), drop_last=True)
    assert len(whole) > 10
    assert run(url, str(tmp_path / "c"), drop_last=True)[0] == whole
