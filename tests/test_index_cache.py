"""JSONL line index cache: a file replaced by another of the same size and mtime is re-indexed (issue 15, item 6)."""
from __future__ import annotations

import json
import os

from zephon.formats import index_cache, open_dataset


def _jsonl(records) -> bytes:
    return b"".join(json.dumps(r).encode() + b"\n" for r in records)


def _same_size(a: bytes, b: bytes) -> tuple[bytes, bytes]:
    """Pad the shorter with trailing blank lines (not samples) so both have the same length."""
    n = max(len(a), len(b))
    return a + b"\n" * (n - len(a)), b + b"\n" * (n - len(b))


def _replace_keeping_stat(path: str, data: bytes, like: os.stat_result) -> None:
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(data)
    os.replace(tmp, path)
    os.utime(path, ns=(like.st_atime_ns, like.st_mtime_ns))
    st = os.stat(path)
    assert (st.st_size, st.st_mtime_ns) == (like.st_size, like.st_mtime_ns)


def _reference(data: bytes) -> list[dict]:
    return [json.loads(line) for line in data.split(b"\n") if line.strip()]


def test_replaced_file_with_same_size_and_mtime_is_reindexed(tmp_path):
    """Fails on the size+mtime key: the old index gives 4 samples and slices the new bytes at old offsets."""
    old, new = _same_size(_jsonl([{"text": f"old document {i}"} for i in range(4)]),
                          _jsonl([{"text": f"n{i}"} for i in range(9)]))
    path = str(tmp_path / "a.jsonl")
    with open(path, "wb") as f:
        f.write(old)
    assert open_dataset(path).num_samples == 4  # builds and stores the index
    assert (tmp_path / ".a.jsonl.zephon-idx.npz").exists()
    _replace_keeping_stat(path, new, os.stat(path))

    ds = open_dataset(path)
    want = _reference(new)
    assert ds.num_samples == len(want) == 9
    assert ds.read(0, range(9)) == want


def test_large_file_replaced_at_its_end_is_reindexed(tmp_path):
    """Past two edge blocks only the ends are hashed: a rewrite of the last records is still seen."""
    base = [{"text": "x" * 200, "i": i} for i in range(2000)]  # ~430 KB, > 2 x 64 KiB
    old = _jsonl(base)
    changed = base[:-3] + [{"text": "y" * 200, "i": 10**6 + k} for k in range(3)]
    new = _jsonl(changed)
    old, new = _same_size(old, new)
    assert len(old) > 2 * index_cache.EDGE_BLOCK
    path = str(tmp_path / "big.jsonl")
    with open(path, "wb") as f:
        f.write(old)
    assert open_dataset(path).num_samples == 2000
    _replace_keeping_stat(path, new, os.stat(path))
    ds = open_dataset(path)
    assert ds.read(0, [1999]) == [_reference(new)[1999]] == [changed[-1]]


def test_unchanged_file_reuses_the_index_without_rebuilding(tmp_path, monkeypatch):
    """The stronger key is still a cache: an untouched file is not indexed again."""
    from zephon.formats import jsonl

    path = str(tmp_path / "a.jsonl")
    with open(path, "wb") as f:
        f.write(_jsonl([{"text": str(i)} for i in range(5)]))
    builds = []
    orig = jsonl.build_line_index
    monkeypatch.setattr(jsonl, "build_line_index", lambda blocks: builds.append(1) or orig(blocks))
    assert open_dataset(path).num_samples == 5 and open_dataset(path).num_samples == 5
    assert len(builds) == 1


def test_edge_digest_reads_only_the_ends(tmp_path):
    """Cheap: a change in the middle of a large file leaves the digest alone (the documented limit), a change in
    either end block changes it."""
    n = 3 * index_cache.EDGE_BLOCK
    data = bytearray(os.urandom(n))
    p = tmp_path / "f"
    p.write_bytes(bytes(data))
    d0 = index_cache.edge_digest(str(p), n)
    for at, same in ((n // 2, True), (0, False), (n - 1, False)):
        changed = bytearray(data)
        changed[at] ^= 0xFF
        p.write_bytes(bytes(changed))
        assert (index_cache.edge_digest(str(p), n) == d0) is same, at
