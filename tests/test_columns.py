"""``engine.columns``: a unit's records cross from a worker process to the pump as columns and come back equal
(values, dtypes, shapes, Python types, key order), through the shared-memory transport too; records that do not
share their keys travel unchanged. The processes runner's output against inline's is tests/test_runners_processes.py.
"""
from __future__ import annotations

import os
import pickle

import numpy as np
import pytest

from zephon.engine import columns, shm
from zephon.formats.records import Src


def assert_same(got: list, want: list) -> None:
    """Equal records: same keys in the same order, same Python types, arrays of equal dtype, shape and values."""
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert type(g) is type(w) and list(g) == list(w)
        if type(w) is not dict:
            assert g == w
            continue
        for k in w:
            assert type(g[k]) is type(w[k]), (k, type(g[k]), type(w[k]))
            if isinstance(w[k], np.ndarray):
                assert g[k].dtype == w[k].dtype and g[k].shape == w[k].shape and np.array_equal(g[k], w[k])
            else:
                assert g[k] == w[k]


def tokenized(n: int, seed: int = 0) -> list:
    """Records shaped as Tokenize emits them: int32 ids of varied lengths (some empty), counts, Src, piece."""
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        ids = rng.integers(0, 50000, size=int(rng.integers(0, 3000)), dtype=np.int32)
        out.append({"input_ids": ids, "num_tokens": int(ids.size), "__src__": Src(1, 2, i, 10 * i + 3),
                    "__piece__": i % 3})
    return out


def travel(records, threshold):
    """What the pump receives: encode, shared memory past ``threshold`` bytes, pickle, and back."""
    enc = columns.encode(records)
    fd, size = None, 0
    if threshold is not None:
        enc, fd, size = shm.pack(enc, threshold)
    try:
        data = pickle.dumps(enc, protocol=pickle.HIGHEST_PROTOCOL)
        return columns.decode(shm.unpack(pickle.loads(data), None if fd is None else os.dup(fd), size))
    finally:
        if fd is not None:
            os.close(fd)


@pytest.mark.parametrize("threshold", [None] + ([64 * 1024] if shm.available() else []))
def test_tokenized_records_come_back_equal_and_independent(threshold):
    recs = tokenized(300)
    recs[5]["input_ids"] = recs[5]["input_ids"][::2]  # a strided view travels as its values
    enc = columns.encode(recs)
    assert type(enc) is tuple  # columns, not 300 pickled records
    got = travel(recs, threshold)
    assert_same(got, recs)
    got[0]["input_ids"][:1] = -7  # each record owns its array: writing one changes no other
    assert all(np.array_equal(g["input_ids"], r["input_ids"]) for g, r in zip(got[1:], recs[1:]))


def test_equal_shaped_arrays_and_mixed_columns_come_back_equal():
    rng = np.random.default_rng(1)
    recs = [{"image": rng.random((8, 8, 3), dtype=np.float32), "text": f"doc {i}", "big": 1 << 70,
             "flag": bool(i % 2), "be": np.arange(i, i + 4, dtype=">f8"), "src": Src(0, 0, i, np.int64(i)),
             "nested": {"a": [i]}} for i in range(20)]
    assert_same(travel(recs, None), recs)


@pytest.mark.parametrize("records", [
    [],
    [{"a": 1}, {"b": 2}],                        # different keys
    [{"a": 1, "b": 2}, {"b": 2, "a": 1}],        # same keys, another order
    [{"a": 1}, [1]],                              # not all dicts
    [{"x": np.zeros(3)}, {"x": np.zeros((3, 1))}],  # arrays of different ranks: a list column
    [{"x": np.zeros(3, np.int32)}, {"x": np.zeros(3, np.int64)}],  # different dtypes
    [{"o": np.array([None, 1], dtype=object)}],  # object arrays stay pickled as they are
    [{}, {}],
])
def test_other_shapes_travel_unchanged_in_value(records):
    got = travel(records, None)
    assert_same(got, records)


def test_records_that_do_not_share_keys_are_not_encoded():
    recs = [{"a": 1}, {"a": 1, "b": 2}]
    assert columns.encode(recs) is recs
