"""Restore entry points refuse what is not a checkpoint dict by name (``checkpoint.check_given``), instead of an
AttributeError deep inside or a silent start at step 0.

Oracle: the types handed in here and an uninterrupted run of the same loader.
"""
from __future__ import annotations

import json

import numpy as np
import pytest

from zephon import Batch, CheckpointError, Decode, Loader, Pack, Tokenize, open_dataset


@pytest.fixture(scope="module")
def docs(tmp_path_factory):
    path = tmp_path_factory.mktemp("given") / "d.jsonl"
    path.write_text("".join(json.dumps({"text": f"document {i} " + "w" * (i % 7)}) + "\n" for i in range(64)))
    return str(path)


def make(path):
    ops = [Decode("text"), Tokenize("bytes", eos_id="<eos>", max_length=32), Pack(32), Batch(2)]
    return Loader([open_dataset(path)], ops, canonical_replicas=2, chunk_size=4, runner="inline")


def ids(mb):
    return np.asarray(mb["input_ids"]).tolist()


def test_loader_restore_names_what_it_got(docs, tmp_path):
    """bytes, a str (a path), a list and None: CheckpointError naming the type and asking for a JSON dict; the
    same checkpoint json.load-ed from its file resumes on the uninterrupted run's next batch."""
    L = make(docs)
    it = iter(L)
    [next(it) for _ in range(3)]
    f = tmp_path / "ckpt.json"
    f.write_text(json.dumps(L.checkpoint()))
    want = ids(next(it))
    for given, name in ((f.read_bytes(), "bytes"), (str(f), "str"), ([json.loads(f.read_text())], "list"),
                        (None, "None")):
        with pytest.raises(CheckpointError) as e:
            make(docs).restore(given)
        assert name in str(e.value) and "dict" in str(e.value), str(e.value)
    R = make(docs)
    R.restore(json.load(open(f)))
    assert ids(next(iter(R))) == want


def test_torch_load_state_dict_refuses_none(docs):
    """zephon_torch.StatefulDataLoader.load_state_dict(None) is refused (it used to start at step 0 silently);
    its own state_dict still restores onto the uninterrupted run's next batch."""
    zephon_torch = pytest.importorskip("zephon_torch")

    def dl():
        ops = [Decode("text"), Tokenize("bytes", eos_id="<eos>", max_length=32), Pack(32), Batch(2)]
        ds = zephon_torch.ZephonIterableDataset([open_dataset(docs)], ops, canonical_replicas=2, chunk_size=4,
                                                global_batch_size=4, runner="inline")
        return zephon_torch.StatefulDataLoader(ds, num_workers=0)

    a = dl()
    it = iter(a)
    [next(it) for _ in range(2)]
    state = json.loads(json.dumps(a.state_dict()))
    want = next(it)["input_ids"].tolist()
    b = dl()
    with pytest.raises(CheckpointError, match="got None"):
        b.load_state_dict(None)
    with pytest.raises(CheckpointError, match="got a bytes"):
        b.load_state_dict(json.dumps(state).encode())
    b.load_state_dict(state)
    assert next(iter(b))["input_ids"].tolist() == want
