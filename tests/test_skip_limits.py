"""Skip accounting with limits (issue 15, item 2): a dataset whose samples are mostly skipped raises naming it,
and a dataset or lane that yields nothing is an error, never a spin. Real Parquet files (pyarrow)."""
from __future__ import annotations


import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from zephon.engine import Loader
from zephon.formats import DataError, open_dataset
from zephon.ops import Batch, Decode, Filter, Shuffle

from helpers import deadline


def _parquet(path, n, field="text", bad=()):
    """``n`` rows; rows in ``bad`` lack ``field`` (None), or every row lacks it when ``field`` is not "text"."""
    path.parent.mkdir(parents=True, exist_ok=True)
    vals = [None if i in bad else f"document {i} of {path.stem}" for i in range(n)]
    pq.write_table(pa.table({field: vals}), path)
    return str(path.parent)


def _never(r):
    return False


def _loader(datasets, ops=None, **kw):
    kw.setdefault("canonical_replicas", 2)
    kw.setdefault("runner", "inline")
    kw.setdefault("unit_size", 32)
    return Loader(datasets, ops or [Decode("text"), Batch(2)], **kw)


def _pull(L, n=10_000):
    out = []
    with deadline(60, "the loader spins"):
        for k, mb in enumerate(L):
            out.append(mb)
            if k + 1 >= n:
                break
    L.close()
    return out


@pytest.mark.parametrize("runner", ["inline", "threads", "processes"])
def test_every_sample_skipped_alone_raises_instead_of_spinning(tmp_path, runner):
    d = _parquet(tmp_path / "bad" / "a.parquet", 300, field="body")
    L = _loader([open_dataset(d, on_error="skip")], runner=runner, num_workers=2)
    with pytest.raises(DataError) as e:
        _pull(L, 5)
    msg = str(e.value)
    assert str(tmp_path / "bad" / "a.parquet") in msg and "fraction of 1.00" in msg
    assert "max_skip_fraction=0.5" in msg and "missing field 'text'" in msg and "sample " in msg


def test_every_sample_skipped_in_a_mixture_raises_naming_that_dataset(tmp_path):
    good = _parquet(tmp_path / "good" / "a.parquet", 400)
    bad = _parquet(tmp_path / "bad" / "b.parquet", 300, field="body")
    L = _loader([open_dataset(good), open_dataset(bad, on_error="skip")], weights=[0.7, 0.3])
    with pytest.raises(DataError) as e:
        _pull(L, 200)
    msg = str(e.value)
    assert str(tmp_path / "bad" / "b.parquet") in msg and "fraction of 1.00" in msg
    assert str(tmp_path / "good") not in msg


def test_a_tolerated_skip_rate_passes_and_a_stricter_limit_refuses_it(tmp_path):
    bad_rows = set(range(0, 400, 5))  # 20 % of the rows lack the field
    d = _parquet(tmp_path / "some" / "a.parquet", 400, bad=bad_rows)
    L = _loader([open_dataset(d, on_error="skip")], exhaustion="stop", shuffle=False)
    rows = sum(len(mb["text"]) - mb.get("__pad__", 0) for mb in _pull(L))
    assert rows == 400 - len(bad_rows)  # default limit 0.5: every good row, the bad ones counted
    assert L.stats()["skipped"] == len(bad_rows)
    for limit in (0.1, [0.1]):
        L = _loader([open_dataset(d, on_error="skip")], exhaustion="stop", max_skip_fraction=limit)
        with pytest.raises(DataError, match=r"a fraction of 0\.[12]\d > max_skip_fraction=0\.1"):
            _pull(L)


def test_per_dataset_limits(tmp_path):
    a = _parquet(tmp_path / "a" / "a.parquet", 200, bad=set(range(0, 200, 4)))  # 25 % bad
    b = _parquet(tmp_path / "b" / "b.parquet", 200, bad=set(range(0, 200, 4)))
    datasets = [open_dataset(a, on_error="skip"), open_dataset(b, on_error="skip")]
    _pull(_loader(datasets, max_skip_fraction=[0.5, 0.3], exhaustion="stop"))
    with pytest.raises(DataError) as e:
        _pull(_loader(datasets, max_skip_fraction=[0.5, 0.2], exhaustion="stop"))
    assert str(tmp_path / "b" / "b.parquet") in str(e.value) and str(tmp_path / "a") not in str(e.value)


def test_finite_pass_of_skipped_samples_raises_instead_of_ending_empty(tmp_path):
    d = _parquet(tmp_path / "bad" / "a.parquet", 40, field="body")
    L = _loader([open_dataset(d, on_error="skip")], exhaustion="stop")
    with pytest.raises(DataError, match="fraction of 1.00"):
        _pull(L)


def test_no_limit_still_never_spins(tmp_path):
    """max_skip_fraction=1.0 allows any skip rate, yet a dataset that gives nothing is an error."""
    d = _parquet(tmp_path / "bad" / "a.parquet", 300, field="body")
    L = _loader([open_dataset(d, on_error="skip")], max_skip_fraction=1.0)
    with pytest.raises(DataError, match=r"gave no record from \d+ samples read \(it holds 300"):
        _pull(L, 5)


def test_a_filter_that_drops_everything_on_the_pump_is_an_error(tmp_path):
    d = _parquet(tmp_path / "good" / "a.parquet", 300)
    L = _loader([open_dataset(d)], [Decode("text"), Shuffle(4), Filter(_never), Batch(2)])
    with pytest.raises(DataError, match=r"lane \d produced no row from the last \d+ samples"):
        _pull(L, 5)


def test_a_filter_on_workers_that_drops_one_dataset_is_an_error(tmp_path):
    good = _parquet(tmp_path / "good" / "a.parquet", 300)
    other = _parquet(tmp_path / "other" / "b.parquet", 100)

    L = _loader([open_dataset(good), open_dataset(other)], [Decode("text"), Filter(_not_other), Batch(2)],
                weights=[0.5, 0.5])
    with pytest.raises(DataError) as e:
        _pull(L, 1000)
    assert str(tmp_path / "other" / "b.parquet") in str(e.value) and ": 0 skipped," in str(e.value)
    assert "gave no record" in str(e.value)


def _not_other(r):
    return "of b" not in r["text"]


def test_bad_max_skip_fraction_is_refused_at_construction(tmp_path):
    d = _parquet(tmp_path / "good" / "a.parquet", 10)
    for bad in (1.5, -0.1, "half", [0.5, 0.5]):
        with pytest.raises(ValueError, match="max_skip_fraction"):
            _loader([open_dataset(d)], max_skip_fraction=bad)
