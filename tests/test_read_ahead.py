"""Read-ahead in the core's order (issue 24, item 7): the engine hints every shard before it reads it, and a
remote dataset fetches what is hinted, a bounded number at a time, without evicting.

Oracles: the shards the pass reads (recorded around ``Dataset.read``), the files and GETs the test counts.
"""
from __future__ import annotations

import json
import os
import time

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
    events: list = []
    read = ds.read
    ds.prefetch = lambda shards: events.extend(("hint", s) for s in shards)

    def recording_read(s, idx):
        events.append(("read", s))
        return read(s, idx)
    ds.read = recording_read
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
