"""zephon_streaming: an epoch cut from the endless mixture (``proportion`` / ``epoch_size``) whose per-stream counts
equal the stream sizes delivers every sample exactly once, as mosaicml-streaming does.

Oracles: the ids written here (60 and 30 of them) and mosaicml-streaming's own StreamingDataset on the same MDS data.
"""
from __future__ import annotations

from collections import Counter

import pytest
from torch.utils.data import DataLoader

streaming = pytest.importorskip("streaming")


def _write(root, sizes):
    for name, n in sizes.items():
        with streaming.MDSWriter(out=str(root / name), columns={"id": "str"}) as w:
            for i in range(n):
                w.write({"id": f"{name}{i}"})


def _epoch(module, root, sizes, **kw):
    total = sum(sizes.values())
    streams = [module.Stream(local=str(root / name), proportion=n / total) for name, n in sizes.items()]
    ds = module.StreamingDataset(streams=streams, batch_size=6, num_canonical_nodes=2, shuffle_seed=3, **kw)
    return [i for b in DataLoader(ds, batch_size=6, num_workers=0) for i in b["id"]]


@pytest.mark.parametrize("sizes", [{"a": 60, "b": 30}, {"a": 90}])
def test_an_epoch_of_the_streams_sizes_reads_each_sample_once(tmp_path, sizes):
    import zephon_streaming
    _write(tmp_path, sizes)
    want = sorted(f"{name}{i}" for name, n in sizes.items() for i in range(n))
    host = _epoch(streaming, tmp_path / ".", sizes)
    assert sorted(host) == want, "mosaicml-streaming's epoch is one whole pass"
    got = _epoch(zephon_streaming, tmp_path, sizes)
    dup = [k for k, c in Counter(got).items() if c > 1]
    assert sorted(got) == want, f"{len(dup)} samples repeated, e.g. {dup[:5]}"
