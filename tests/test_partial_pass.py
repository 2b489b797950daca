"""exhaustion="stop" with weights that end the pass before every dataset is read warns once (PartialPassWarning),
naming the datasets and how many of their samples were left unread; proportional weights read everything once.
Oracle: rows of two JSONL files written here, counted per file from what the loader delivered."""
from __future__ import annotations

import json
import re
import warnings

import pytest

from zephon import Batch, Decode, Loader, PartialPassWarning, open_dataset

SIZES = {"big": 1234, "small": 917}


@pytest.fixture
def datasets(tmp_path):
    out = []
    for name, n in SIZES.items():
        p = tmp_path / f"{name}.jsonl"
        p.write_text("".join(json.dumps({"text": f"{name} {i}"}) + "\n" for i in range(n)))
        out.append(open_dataset(str(p), name=name))
    return out


def _loader(datasets, weights):
    return Loader(datasets, [Decode("text"), Batch(1, drop_last=False)], weights=weights, canonical_replicas=2,
                  exhaustion="stop", runner="inline")


def _delivered(L) -> dict:
    got = {name: set() for name in SIZES}
    for mb in L:
        if not mb.get("__pad__"):
            name, i = mb["text"][0].split()
            got[name].add(int(i))
    return {k: len(v) for k, v in got.items()}


def test_equal_weights_warn_naming_what_is_left(datasets):
    with pytest.warns(PartialPassWarning) as rec:
        L = _loader(datasets, None)
    got = _delivered(L)
    assert got["small"] == SIZES["small"] and got["big"] < SIZES["big"]  # the pass ends when 'small' runs out
    (w,) = [r for r in rec if r.category is PartialPassWarning]
    msg = str(w.message)
    left = SIZES["big"] - got["big"]
    assert f"'big' {left:,} of {SIZES['big']:,} samples" in msg and "'small' runs out" in msg
    assert not re.search(r"'small' [\d,]+ of", msg)  # a dataset read whole is not listed as partly unread


def test_warns_once_for_the_same_config(datasets):
    with warnings.catch_warnings(record=True) as rec:
        warnings.simplefilter("default")
        for _ in range(3):
            _loader(datasets, [1, 1])
    assert sum(r.category is PartialPassWarning for r in rec) == 1


def test_proportional_weights_read_everything_once_without_warning(datasets):
    with warnings.catch_warnings():
        warnings.simplefilter("error", PartialPassWarning)
        L = _loader(datasets, list(SIZES.values()))
    assert _delivered(L) == SIZES
