"""Columnar transport of a unit's records between a worker process and the pump (``runner="processes"``).

A unit holds hundreds of records, each a small dict (``input_ids`` of a few hundred tokens, ``num_tokens``, its
``Src``). Pickled one by one, every record costs a dict, a numpy array's reduce and a NamedTuple on both sides:
about 20 microseconds, as much as a tenth of what tokenizing it costs. ``encode`` turns a list of dicts with the
same keys (in the same order) into one column per key: arrays of one dtype become a single concatenated array
(1-D arrays of any length, with their lengths) or a stacked one (equal shapes); plain ints and ``Src`` become int64
arrays; anything else stays a list. The large arrays then cross in shared memory (``engine.shm``) as one block,
and ``decode`` rebuilds equal records from it. Only the transport changes: values, dtypes,
shapes, key order and Python types come back as they were sent (tests/test_columns.py).
"""
from __future__ import annotations

import numpy as np

from ..formats.records import Src

INT64 = (-(1 << 63), (1 << 63) - 1)


def _array_column(vals: list):
    """``("flat", concatenated, lengths)`` for 1-D arrays of one dtype, ``("stack", stacked)`` for arrays of one
    dtype and shape; None when ``vals`` are not all such plain numpy arrays."""
    v0 = vals[0]
    dt, shape = v0.dtype, v0.shape
    if dt.hasobject:
        return None
    for v in vals:
        if type(v) is not np.ndarray or v.dtype != dt:
            return None
    if v0.ndim == 1 and any(v.ndim != 1 for v in vals):
        return None
    # explicit ``out`` arrays: numpy's stack and concatenate would turn a non-native byte order native
    if all(v.shape == shape for v in vals):
        return ("stack", np.stack(vals, out=np.empty((len(vals),) + shape, dtype=dt)))
    if all(v.ndim == 1 for v in vals):
        lengths = np.fromiter((v.size for v in vals), np.int64, len(vals))
        return ("flat", np.concatenate(vals, out=np.empty(int(lengths.sum()), dtype=dt)), lengths)
    return None


def _encode_column(vals: list):
    v0 = vals[0]
    t = type(v0)
    if t is np.ndarray:
        col = _array_column(vals)
        if col is not None:
            return col
    elif t is int:
        if all(type(v) is int for v in vals) and INT64[0] <= min(vals) and max(vals) <= INT64[1]:
            return ("int", np.array(vals, dtype=np.int64))
    elif t is Src:
        if all(type(v) is Src for v in vals):
            flat = [x for v in vals for x in v]
            if all(type(x) is int for x in flat) and INT64[0] <= min(flat) and max(flat) <= INT64[1]:
                return ("src", np.array(flat, dtype=np.int64).reshape(len(vals), 4))
    return ("list", vals)


def encode(records):
    """The columns of ``records`` (a unit's list of dicts), or ``records`` itself when they are not all dicts
    with the same keys in the same order (then they travel as before).

    records: list of dicts (any other value is returned unchanged).
    Returns a tuple ``(count, keys, columns)`` (``decode`` tells it from a list by its type)."""
    if type(records) is not list or not records or type(records[0]) is not dict:
        return records
    keys = tuple(records[0])
    for r in records:
        if type(r) is not dict or len(r) != len(keys) or tuple(r) != keys:
            return records
    return (len(records), keys, [_encode_column([r[k] for r in records]) for k in keys])


def _decode_column(col) -> list:
    kind = col[0]
    if kind == "flat":  # copies: small arrays that each keep only their own memory (not the unit's mapping)
        data, ends = col[1], np.cumsum(col[2]).tolist()
        starts = [0] + ends[:-1]
        return [data[a:b].copy() for a, b in zip(starts, ends)]
    if kind == "stack":
        return list(col[1])
    if kind == "int":
        return col[1].tolist()
    if kind == "src":
        return [Src(*t) for t in col[1].tolist()]
    return col[1]


def decode(obj):
    """The records ``encode`` turned into ``obj`` (a list passes through unchanged).

    Returns a list of new dicts whose arrays are writable and not shared between records: copies for 1-D arrays,
    views of the stacked column (shared memory, no copy) for arrays of equal shapes."""
    if type(obj) is not tuple:
        return obj
    n, keys, cols = obj
    if not keys:
        return [{} for _ in range(n)]
    return [dict(zip(keys, row)) for row in zip(*[_decode_column(c) for c in cols])]
