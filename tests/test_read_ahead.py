"""Read-ahead in the core's order (issue 24, item 7): the engine hints every shard before it reads it, and a
remote dataset fetches what is hinted, a bounded number at a time, without evicting.

Oracles: the shards the pass reads (recorded around ``Dataset.read``), the files and GETs the test counts.
"""
from __future__ import annotations

import json
import os
import time

import numpy as np
import pytest

from zephon import Batch, Loader
from zephon.formats import open_dataset
from zephon.formats import remote as zr

from test_remote_trust import write_ids


def test_every_shard_is_hinted_before_its_first_read(tmp_path):
    for f in range(12):
        with open(tmp_path / f"part-{f:02d}.jsonl", "w") as out:
            for i in range(10):
                out.write(json.dumps({"id": f * 100 + i}) + "\n")
    ds = open_dataset(str(tmp_path), columns=["id"])
    events = _record_hints_and_reads(ds)
    L = Loader([ds], [Batch(4)], seed=1, canonical_replicas=2, global_batch_size=8, chunk_size=6, shuffle=True,
               exhaustion="stop", runner="inline")
    delivered = [int(x) for b in L for x in b["id"]]
    assert len(set(delivered)) == len(delivered) > 100
    assert set(delivered) <= {f * 100 + i for f in range(12) for i in range(10)}
    first_hint = {}
    for k, (what, s) in enumerate(events):
        if what == "hint":
            first_hint.setdefault(s, k)
    reads = [(k, s) for k, (what, s) in enumerate(events) if what == "read"]
    assert reads and all(s in first_hint and first_hint[s] < k for k, s in reads), events[:40]
    assert set(first_hint) == {s for _, s in reads}  # nothing hinted that the pass does not read


def test_a_remote_dataset_fetches_hinted_shards_in_the_background(s3, tmp_path):
    src = write_ids(tmp_path / "src", 0)
    url = s3.upload_dir(src, "ra")
    local = tmp_path / "c"
    ds = open_dataset(url, local=str(local), read_ahead=2)
    names = sorted(f for f in os.listdir(src) if f.startswith("shard."))
    before = zr.stats()["downloads"]
    ds.prefetch([3, 1])
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and zr.stats()["downloads"] - before < 2:
        time.sleep(0.02)
    time.sleep(0.2)  # anything else would have started by now
    assert sorted(f for f in os.listdir(local) if f.startswith("shard.")) == sorted([names[1], names[3]])
    assert zr.stats()["downloads"] - before == 2
    with pytest.raises(ValueError, match="read_ahead"):
        open_dataset(url, local=str(local), read_ahead=-1)


def _record_hints_and_reads(ds) -> list:
    """Events ``("hint", shard)`` / ``("read", shard)`` of ``ds`` in the order they happen."""
    events: list = []
    read = ds.read
    ds.prefetch = lambda shards: events.extend(("hint", s) for s in shards)

    def recording_read(s, idx):
        events.append(("read", s))
        return read(s, idx)
    ds.read = recording_read
    return events


def test_the_horizon_is_a_setting_of_the_remote_dataset(s3, tmp_path):
    # 120 rows read in order (one lane, no shuffle) in chunks of 4: before the first read, the lane hinted
    # chunks 0..horizon, i.e. the shards holding rows [0, 4 x (horizon + 1)); the default horizon is 16 chunks
    src = write_ids(tmp_path / "src", 0)
    url = s3.upload_dir(src, "horizon")
    for chunks in (3, None, 40):
        kw = {} if chunks is None else {"read_ahead_chunks": chunks}
        ds = open_dataset(url, local=str(tmp_path / f"c{chunks}"), **kw)
        ends = np.cumsum(ds.shard_sizes)  # shard k holds rows [ends[k-1], ends[k])
        assert len(ends) >= 4 and ends[-1] == 120
        rows = min(4 * ((16 if chunks is None else chunks) + 1), 120)
        expected = {k for k in range(len(ends)) if (ends[k - 1] if k else 0) < rows}
        events = _record_hints_and_reads(ds)
        L = Loader([ds], [Batch(4)], seed=1, canonical_replicas=1, global_batch_size=4, chunk_size=4, shuffle=False,
                   exhaustion="stop", runner="inline")
        assert sorted(int(x) for b in L for x in b["id"]) == list(range(120))
        first_read = next(k for k, (what, _) in enumerate(events) if what == "read")
        assert {s for what, s in events[:first_read] if what == "hint"} == expected, (chunks, events[:first_read])
    with pytest.raises(ValueError, match="read_ahead_chunks"):
        open_dataset(url, local=str(tmp_path / "bad"), read_ahead_chunks=-1)


def test_a_read_of_many_samples_checks_and_pins_the_cached_copy_once(s3, tmp_path):
    # every other sample of a shard: runs of one sample each, one pread each; the copy is located (ensure)
    # and pinned once for the whole read, not once per sample
    url = s3.upload_dir(write_ids(tmp_path / "src", 1000), "pins")
    ds = open_dataset(url, local=str(tmp_path / "c"), read_ahead=0)
    calls = []
    ensure = ds.remote.ensure
    ds.remote.ensure = lambda meta, shard: calls.append(shard) or ensure(meta, shard)
    wanted = list(range(0, ds.shard_sizes[0], 2))
    assert len(wanted) >= 5
    ds.read(0, [0])  # opens the reader (header read, download)
    calls.clear()
    assert [int(r["id"]) for r in ds.read(0, wanted)] == [1000 + i for i in wanted]
    assert calls == [0]
