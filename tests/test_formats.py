"""zephon.formats against real files written with json, gzip, zstandard and pyarrow.

Every expected value is computed independently of the code under test (plain-Python line splitting
plus json.loads, pyarrow.parquet.read_table), never by the readers themselves.
"""
from __future__ import annotations

import gzip
import json
import multiprocessing as mp
import os
import pickle
import random
import shutil
import threading

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import zstandard

from zephon.formats import DataError, DataWarning, Dataset, ShardInfo, inspect_source, open_dataset
from zephon.formats import codecs, index_cache, jsonl

# ---------------------------------------------------------------- helpers


def make_records(n, seed=0, prefix="doc"):
    rng = random.Random(seed)
    out = []
    for i in range(n):
        out.append({
            "id": i,
            "text": f"{prefix} {i} " + "".join(rng.choice("abcdé漢 \"\\\t") for _ in range(rng.randint(0, 40))),
            "score": rng.random() if i % 5 else None,
            "meta": {"tags": [rng.randint(0, 9) for _ in range(i % 4)], "ok": bool(i % 2)},
        })
    return out


def encode_jsonl(records, *, blanks=True, trailing_newline=True, crlf=False):
    """JSON Lines bytes; with blanks, whitespace-only lines are sprinkled in (they are not samples)."""
    eol = "\r\n" if crlf else "\n"
    lines = []
    for i, r in enumerate(records):
        if blanks and i % 7 == 3:
            lines.append(" \t ")
        if blanks and i % 11 == 5:
            lines.append("")
        lines.append(json.dumps(r, ensure_ascii=i % 2 == 0))
    text = eol.join(lines) + (eol if trailing_newline else "")
    return text.encode("utf-8")


def write_bytes(path, raw, compress=None):
    if compress == "gz":
        raw = gzip.compress(raw)
    elif compress == "zst":
        raw = zstandard.ZstdCompressor().compress(raw)
    path.write_bytes(raw)
    return str(path)


def write_jsonl(path, records, compress=None, **kw):
    return write_bytes(path, encode_jsonl(records, **kw), compress)


def reference_jsonl(path):
    """Records of a JSONL file read with plain Python (independent of zephon)."""
    with open(path, "rb") as f:
        raw = f.read()
    if path.endswith(".gz"):
        raw = gzip.decompress(raw)
    elif path.endswith(".zst"):
        raw = zstandard.ZstdDecompressor().decompressobj().decompress(raw)
    return [json.loads(line) for line in raw.decode("utf-8").split("\n") if line.strip(" \t\r")]


def write_parquet(path, records, row_group_size=7):
    table = pa.Table.from_pylist(records)
    pq.write_table(table, str(path), row_group_size=row_group_size)
    return str(path)


def index_orders(n, rng):
    """Index lists exercising any order: sorted, reversed, shuffled, with repeats, one, empty."""
    idx = list(range(n))
    shuffled = idx[:]
    rng.shuffle(shuffled)
    return [idx, idx[::-1], shuffled, [rng.randrange(n) for _ in range(3 * n)], [n - 1], [0, 0, 0], []]


# ---------------------------------------------------------------- JSONL random access


@pytest.mark.parametrize("compress", [None, "gz", "zst"])
def test_jsonl_random_access_matches_reference(tmp_path, compress):
    suffix = {None: "", "gz": ".gz", "zst": ".zst"}[compress]
    path = write_jsonl(tmp_path / f"a.jsonl{suffix}", make_records(60), compress)
    ref = reference_jsonl(path)
    assert len(ref) == 60
    ds = open_dataset(path)
    assert ds.num_samples == 60 and ds.shard_sizes == [60] and ds.name == "a"
    assert ds.shards[0] == ShardInfo(path, 60, "jsonl", os.path.getsize(path), os.stat(path).st_mtime_ns)
    rng = random.Random(1)
    for order in index_orders(60, rng):
        assert ds.read(0, order) == [ref[i] for i in order]
    assert ds.read(0, np.array([5, 2], dtype=np.int32)) == [ref[5], ref[2]]


def test_jsonl_repeated_indices_give_independent_dicts(tmp_path):
    ds = open_dataset(write_jsonl(tmp_path / "a.jsonl", make_records(5)))
    a, b = ds.read(0, [3, 3])
    a["text"] = "changed"
    assert b["text"] != "changed"


@pytest.mark.parametrize("compress", [None, "gz", "zst"])
def test_jsonl_tiny_blocks_crlf_no_trailing_newline(tmp_path, monkeypatch, compress):
    # Lines straddle block boundaries; CRLF endings; last line has no newline.
    monkeypatch.setattr(codecs, "BLOCK_SIZE", 5)
    monkeypatch.setattr(codecs, "_ZSTD_INPUT_BLOCK", 3)
    suffix = {None: "", "gz": ".gz", "zst": ".zst"}[compress]
    path = write_jsonl(tmp_path / f"b.jsonl{suffix}", make_records(30), compress, crlf=True,
                       trailing_newline=False)
    ref = reference_jsonl(path)
    ds = open_dataset(path)
    assert ds.num_samples == len(ref) == 30
    order = list(range(30))
    random.Random(2).shuffle(order)
    assert ds.read(0, order) == [ref[i] for i in order]


def test_multi_frame_zstd(tmp_path):
    recs = make_records(20)
    raw = encode_jsonl(recs)
    cut = len(raw) // 3
    frames = zstandard.ZstdCompressor().compress(raw[:cut]) + \
        zstandard.ZstdCompressor(write_checksum=True).compress(raw[cut:])
    path = write_bytes(tmp_path / "m.jsonl.zst", frames)
    ds = open_dataset(path)
    assert ds.read(0, range(20)) == [json.loads(json.dumps(r)) for r in recs]


def test_build_line_index_matches_python_split():
    # Seeded random cases (not hypothesis: it writes a .hypothesis/ directory into the repo).
    rng = random.Random(7)
    pieces = ["", " ", "\t\r", '{"a":1}', ' {"b": [2]} ', "x", "\r", "é"]
    for _ in range(1500):
        lines = [rng.choice(pieces) for _ in range(rng.randint(0, 12))]
        data = "\n".join(lines).encode() + rng.choice(["", "\n", "\n\n", " "]).encode()
        starts, pos = [], 0
        for line in data.split(b"\n"):
            if line.strip(b" \t\r"):
                starts.append(pos)
            pos += len(line) + 1
        block = rng.randint(1, 9)
        blocks = [data[i:i + block] for i in range(0, len(data), block)]
        assert jsonl.build_line_index(blocks).tolist() == starts + [len(data)], (data, block)


def test_decompressed_cache_is_bounded(tmp_path):
    paths = [write_jsonl(tmp_path / f"{i}.jsonl.zst", make_records(5, seed=i), "zst") for i in range(4)]
    ds = open_dataset(paths)
    codecs.clear_cache()
    for shard in range(4):
        assert ds.read(shard, [4, 0]) == [reference_jsonl(paths[shard])[i] for i in (4, 0)]
        assert len(codecs._cache) <= codecs.MAX_DECOMPRESSED


def test_threads_share_a_dataset(tmp_path):
    paths = [write_jsonl(tmp_path / "p.jsonl", make_records(40)),
             write_parquet(tmp_path / "q.parquet", make_records(40, seed=3), row_group_size=6)]
    refs = [reference_jsonl(paths[0]), pq.read_table(paths[1]).to_pylist()]
    ds = open_dataset(paths)
    failures = []

    def work(seed):
        rng = random.Random(seed)
        for _ in range(30):
            shard = rng.randrange(2)
            idx = [rng.randrange(40) for _ in range(5)]
            if ds.read(shard, idx) != [refs[shard][i] for i in idx]:
                failures.append((shard, idx))

    threads = [threading.Thread(target=work, args=(s,)) for s in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert failures == []


# ---------------------------------------------------------------- Parquet


def test_parquet_random_access_across_row_groups(tmp_path):
    path = write_parquet(tmp_path / "a.parquet", make_records(50), row_group_size=7)
    assert pq.ParquetFile(path).metadata.num_row_groups == 8
    ref = pq.read_table(path).to_pylist()
    ds = open_dataset(path)
    assert ds.shards[0] == ShardInfo(path, 50, "parquet", os.path.getsize(path), os.stat(path).st_mtime_ns)
    for order in index_orders(50, random.Random(3)):
        assert ds.read(0, order) == [ref[i] for i in order]


def test_parquet_reads_only_needed_row_groups_and_columns(tmp_path, monkeypatch):
    path = write_parquet(tmp_path / "a.parquet", make_records(50), row_group_size=7)
    ref = pq.read_table(path).to_pylist()
    calls = []
    orig = pq.ParquetFile.read_row_group

    def spy(self, i, columns=None, **kw):
        calls.append((i, columns))
        return orig(self, i, columns=columns, **kw)

    monkeypatch.setattr(pq.ParquetFile, "read_row_group", spy)
    ds = open_dataset(path, columns=["text", "id"])
    assert ds.read(0, [15, 8, 20, 48]) == [{"text": ref[i]["text"], "id": ref[i]["id"]} for i in (15, 8, 20, 48)]
    # rows 8, 15, 20 live in groups 1, 2 (0-based, 7 rows each); 48 in group 6
    assert sorted(i for i, _ in calls) == [1, 2, 6]
    assert all(cols == ["text", "id"] for _, cols in calls)
    calls.clear()
    ds.read(0, [47, 44, 42])  # group 6 (rows 42-48) is cached
    assert calls == []


# ---------------------------------------------------------------- discovery


def test_directory_glob_and_list_discovery(tmp_path):
    d = tmp_path / "data"
    (d / "sub").mkdir(parents=True)
    (d / ".hidden").mkdir()
    specs = {  # relative path -> number of records
        "b.jsonl": 3, "a.parquet": 4, "sub/c.jsonl.gz": 5, "sub/a.jsonl.zst": 6, "z.ndjson": 2,
    }
    for rel, n in specs.items():
        p = d / rel
        if rel.endswith(".parquet"):
            write_parquet(p, make_records(n))
        else:
            comp = "gz" if rel.endswith(".gz") else "zst" if rel.endswith(".zst") else None
            write_jsonl(p, make_records(n), comp)
    write_jsonl(d / ".hidden" / "x.jsonl", make_records(9))   # hidden: skipped
    (d / "notes.txt").write_text('{"a": 1}\n')                # unknown extension: skipped

    ds = open_dataset(str(d))
    expected = sorted(specs)  # sorted by relative path
    assert [os.path.relpath(s.path, d) for s in ds.shards] == expected
    assert ds.shard_sizes == [specs[r] for r in expected]
    assert ds.num_samples == sum(specs.values())
    assert ds.name == "data"
    assert {s.format for s in ds.shards} == {"jsonl", "parquet"}

    g = open_dataset(str(d / "**" / "*.jsonl*"))
    assert [os.path.relpath(s.path, d) for s in g.shards] == ["b.jsonl", "sub/a.jsonl.zst", "sub/c.jsonl.gz"]

    only = open_dataset(str(d), format="parquet")
    assert [os.path.basename(s.path) for s in only.shards] == ["a.parquet"]

    lst = open_dataset([str(d / "z.ndjson"), str(d / "sub")])
    assert [os.path.relpath(s.path, d) for s in lst.shards] == ["z.ndjson", "sub/a.jsonl.zst", "sub/c.jsonl.gz"]
    assert lst.shard_sizes == [2, 6, 5]

    txt = open_dataset(str(d / "*.txt"), format="jsonl")
    assert txt.read(0, [0]) == [{"a": 1}]

    with pytest.raises(DataError, match="no supported files matched"):
        open_dataset(str(d / "*.csv"))
    with pytest.raises(DataError, match="no such file"):
        open_dataset(str(d / "missing.jsonl"))
    with pytest.raises(DataError, match="listed twice"):
        open_dataset([str(d / "b.jsonl"), str(d / "b.jsonl")])
    with pytest.raises(DataError, match="unknown file type"):
        open_dataset(str(d / "notes.txt"))
    empty_dir = tmp_path / "empty"
    empty_dir.mkdir()
    with pytest.raises(DataError, match="no supported files in directory"):
        open_dataset(str(empty_dir))


def test_inspect_source(tmp_path):
    j = write_jsonl(tmp_path / "a.jsonl", [{"x": 1, "y": "s"}, {"z": 2}])
    info = inspect_source(j)
    assert info["format"] == "jsonl" and info["num_shards"] == 1 and info["num_samples"] == 2
    assert info["columns"] == ["x", "y"]
    assert info["shards"] == [{"path": j, "format": "jsonl", "num_samples": 2, "size_bytes": os.path.getsize(j),
                               "columns": ["x", "y"]}]
    p = write_parquet(tmp_path / "b.parquet", make_records(3))
    assert inspect_source(p)["columns"] == pq.read_schema(p).names
    both = inspect_source(str(tmp_path))
    names = pq.read_schema(p).names
    assert both["format"] == "mixed" and both["num_samples"] == 5
    assert both["columns"] == [c for c in ("x", "y") if c in names]  # only columns every file has
    assert [s["columns"] for s in both["shards"]] == [["x", "y"], names]
    json.dumps(both)


# ---------------------------------------------------------------- index cache


def test_index_cache_reused_then_rebuilt_after_change(tmp_path, monkeypatch):
    builds = []
    orig = jsonl.build_line_index
    monkeypatch.setattr(jsonl, "build_line_index", lambda blocks: builds.append(1) or orig(blocks))
    path = write_jsonl(tmp_path / "a.jsonl", make_records(10))
    sidecar = tmp_path / ".a.jsonl.zephon-idx.npz"

    assert open_dataset(path).num_samples == 10
    assert len(builds) == 1 and sidecar.exists()
    stamp = sidecar.stat().st_mtime_ns
    with np.load(sidecar, allow_pickle=False) as z:  # plain arrays, no pickle
        assert z["index"].dtype == np.int64 and len(z["index"]) == 11

    ds = open_dataset(path)
    assert len(builds) == 1 and sidecar.stat().st_mtime_ns == stamp
    assert ds.read(0, [9]) == [reference_jsonl(path)[9]]

    with open(path, "ab") as f:  # modify: size and mtime change
        f.write(b'{"id": "new"}\n')
    ds = open_dataset(path)
    assert len(builds) == 2 and ds.num_samples == 11
    assert ds.read(0, [10]) == [{"id": "new"}]

    sidecar.write_bytes(b"not a zip file")  # a damaged cache is rebuilt, not an error
    assert open_dataset(path).num_samples == 11 and len(builds) == 3


def test_stale_line_index_is_named_when_a_line_does_not_parse(tmp_path):
    # two middle lines of different lengths swapped, size and mtime kept: the stamp (size, mtime, edge blocks)
    # cannot see it (documented), so the cached offsets cut lines wrongly; the error must point at the index
    lines = [json.dumps({"text": f"line {i:05d} " + "x" * (5 + (i * 7) % 40)}) for i in range(20000)]
    path = tmp_path / "a.jsonl"
    path.write_text("\n".join(lines) + "\n")
    sidecar = tmp_path / ".a.jsonl.zephon-idx.npz"
    assert open_dataset(str(path)).num_samples == 20000 and sidecar.exists()
    k = 10000
    assert len(lines[k]) != len(lines[k + 1])
    st = path.stat()
    path.write_text("\n".join(lines[:k] + [lines[k + 1], lines[k]] + lines[k + 2:]) + "\n")
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert path.stat().st_size == st.st_size
    ds = open_dataset(str(path))
    with pytest.raises(DataError) as e:
        ds.read(0, [k, k + 1])
    msg = str(e.value)
    assert "invalid JSON" in msg and f"line index {sidecar} may be stale" in msg and "delete" in msg
    sidecar.unlink()  # as the message says: rebuilt, the swapped lines read
    assert open_dataset(str(path)).read(0, [k, k + 1]) == [json.loads(lines[k + 1]), json.loads(lines[k])]


def test_bad_line_of_a_fresh_line_index_does_not_blame_the_index(tmp_path):
    path = tmp_path / "b.jsonl"
    path.write_text('{"text": "a"}\n{"text": "broken\n')
    with pytest.raises(DataError) as e:
        open_dataset(str(path)).read(0, [1])
    assert "invalid JSON" in str(e.value) and "stale" not in str(e.value)


def test_index_cache_falls_back_to_cache_dir(tmp_path, monkeypatch):
    path = write_jsonl(tmp_path / "a.jsonl", make_records(4))
    blocker = tmp_path / "blocker"
    blocker.write_text("a file, so no directory can be created under it")
    monkeypatch.setattr(index_cache, "sidecar_path", lambda p: str(blocker / "x.npz"))
    cache = tmp_path / "cache"
    ds = open_dataset(path, cache_dir=str(cache))
    assert ds.num_samples == 4
    (entry,) = os.listdir(cache)
    assert entry.endswith("-a.jsonl.zephon-idx.npz")
    assert entry == os.path.basename(index_cache.fallback_path(path, str(cache)))
    monkeypatch.setenv("ZEPHON_CACHE_DIR", str(tmp_path / "envcache"))
    assert index_cache.fallback_path(path, None).startswith(str(tmp_path / "envcache"))


def test_file_changed_after_open_is_reported(tmp_path):
    path = write_jsonl(tmp_path / "a.jsonl", make_records(4))
    ds = pickle.loads(pickle.dumps(open_dataset(path)))  # fresh copy: no reader opened yet
    with open(path, "ab") as f:
        f.write(b'{"id": 99}\n')
    with pytest.raises(DataError, match="changed since the dataset was opened") as e:
        ds.read(0, [0])
    assert e.value.path == path and e.value.shard == 0


# ---------------------------------------------------------------- errors


def _two_shards(tmp_path, bad_raw, name="bad.jsonl", **kw):
    good = write_jsonl(tmp_path / "good.jsonl", make_records(3))
    bad = write_bytes(tmp_path / name, bad_raw)
    return good, bad, open_dataset([good, bad], **kw)


def test_malformed_json_line_names_file_shard_sample_line(tmp_path):
    _, bad, ds = _two_shards(tmp_path, b'{"a": 1}\n\n{"a": 2}\n{"a": 3,, }\n{"a": 4}\n')
    assert ds.read(1, [0, 1, 3]) == [{"a": 1}, {"a": 2}, {"a": 4}]
    with pytest.raises(DataError) as e:
        ds.read(1, [3, 2])
    msg = str(e.value)
    assert msg.startswith(f"{bad} (shard 1, sample 2, line 4): invalid JSON")
    assert (e.value.path, e.value.shard, e.value.sample, e.value.line) == (bad, 1, 2, 4)
    assert "invalid JSON" in e.value.reason and bad not in e.value.reason


@pytest.mark.parametrize("compress", ["gz", "zst"])
def test_malformed_line_in_compressed_file(tmp_path, compress):
    path = write_bytes(tmp_path / f"c.jsonl.{compress}", b'{"a": 1}\n \n\n{oops}\n', compress)
    with pytest.raises(DataError, match=r"\(shard 0, sample 1, line 4\): invalid JSON") as e:
        open_dataset(path).read(0, [1])
    assert str(e.value).startswith(path)


def test_line_that_is_not_an_object(tmp_path):
    _, bad, ds = _two_shards(tmp_path, b'{"a": 1}\n[1, 2]\n"str"\n')
    with pytest.raises(DataError, match=r"\(shard 1, sample 1, line 2\): expected a JSON object, got an array"):
        ds.read(1, [1])
    with pytest.raises(DataError, match="sample 2, line 3.*got a string") as e:
        ds.read(1, [2])
    assert str(e.value).startswith(bad)


def test_missing_required_column(tmp_path):
    _, bad, ds = _two_shards(tmp_path, b'{"id": 1, "text": "x"}\n{"id": 2}\n', columns=["text", "id"])
    assert ds.read(1, [0]) == [{"text": "x", "id": 1}]
    assert ds.read(0, [0]) == [{"text": r["text"], "id": r["id"]} for r in make_records(1)]
    with pytest.raises(DataError, match=r"\(shard 1, sample 1, line 2\): missing column 'text'") as e:
        ds.read(1, [1])
    assert str(e.value).startswith(bad)


@pytest.mark.parametrize("content", [b"", b"\n \n\t\r\n"])
def test_empty_file_raises_or_is_skipped_with_warning(tmp_path, content):
    good = write_jsonl(tmp_path / "good.jsonl", make_records(3))
    empty = write_bytes(tmp_path / "empty.jsonl", content)
    with pytest.raises(DataError, match="empty file") as e:
        open_dataset([good, empty])
    assert str(e.value).startswith(f"{empty} (shard 1)") and e.value.shard == 1
    with pytest.warns(DataWarning, match=f"{empty}.*shard 1.*empty file"):
        ds = open_dataset([good, empty], on_error="skip")
    assert ds.shard_sizes == [3, 0]


def test_empty_parquet_file(tmp_path):
    path = str(tmp_path / "e.parquet")
    pq.write_table(pa.table({"text": pa.array([], pa.string())}), path)
    with pytest.raises(DataError, match=r"\(shard 0\): empty file"):
        open_dataset(path)


@pytest.mark.parametrize("compress,label", [("zst", "zstd"), ("gz", "gzip")])
def test_truncated_compressed_file_fails_at_open(tmp_path, compress, label):
    raw = encode_jsonl(make_records(200))
    full = (gzip.compress(raw) if compress == "gz" else zstandard.ZstdCompressor().compress(raw))
    good = write_jsonl(tmp_path / "good.jsonl", make_records(3))
    bad = write_bytes(tmp_path / f"t.jsonl.{compress}", full[: len(full) // 2])
    with pytest.raises(DataError, match=f"truncated or corrupt {label} stream") as e:
        open_dataset([good, bad])
    assert str(e.value).startswith(f"{bad} (shard 1)")
    garbage = write_bytes(tmp_path / f"g.jsonl.{compress}", b"this is not compressed at all")
    with pytest.raises(DataError, match=f"truncated or corrupt {label} stream"):
        open_dataset(garbage)


def test_parquet_missing_column_lists_present_columns(tmp_path):
    good = write_parquet(tmp_path / "a.parquet", [{"text": "x", "id": 1}])
    bad = write_parquet(tmp_path / "b.parquet", [{"body": "x", "id": 1}])
    with pytest.raises(DataError) as e:
        open_dataset([good, bad], columns=["text"])
    assert str(e.value) == f"{bad} (shard 1): missing column 'text' (file has: 'body', 'id')"


def test_not_a_parquet_file(tmp_path):
    path = write_bytes(tmp_path / "x.parquet", b"PAR1 garbage")
    with pytest.raises(DataError, match=r"\(shard 0\): not a readable Parquet file"):
        open_dataset(path)


def test_skip_mode_returns_error_records(tmp_path):
    raw = b'{"a": 0}\n{bad\n{"a": 2}\n[3]\n{"b": 4}\n'
    path = write_bytes(tmp_path / "s.jsonl", raw)
    ds = open_dataset(path, on_error="skip", columns=["a"])
    out = ds.read(0, [4, 0, 1, 2, 3, 1])
    assert out[1] == {"a": 0} and out[3] == {"a": 2}
    errs = {i: r["__error__"] for i, r in zip([4, 0, 1, 2, 3, 1], out) if "__error__" in r}
    assert set(errs) == {1, 3, 4}
    assert errs[1].startswith(f"{path} (shard 0, sample 1, line 2): invalid JSON")
    assert errs[3].startswith(f"{path} (shard 0, sample 3, line 4): expected a JSON object")
    assert errs[4].startswith(f"{path} (shard 0, sample 4, line 5): missing column 'a'")
    assert out[2] == out[5] and set(out[2]) == {"__error__"}
    with pytest.raises(DataError):
        open_dataset(path, columns=["a"]).read(0, [1])


def test_out_of_range_is_index_error(tmp_path):
    ds = open_dataset(write_jsonl(tmp_path / "a.jsonl", make_records(3)))
    with pytest.raises(IndexError):
        ds.read(0, [3])
    with pytest.raises(IndexError):
        ds.read(0, [-1])
    with pytest.raises(IndexError):
        ds.read(1, [0])


def test_data_error_fields_and_pickle():
    e = DataError("boom", path="/d/a.jsonl", shard=3, sample=17, line=18)
    assert str(e) == "/d/a.jsonl (shard 3, sample 17, line 18): boom"
    assert isinstance(e, ValueError)
    e2 = pickle.loads(pickle.dumps(e))
    assert str(e2) == str(e) and (e2.path, e2.shard, e2.sample, e2.line, e2.reason) == \
        ("/d/a.jsonl", 3, 17, 18, "boom")
    assert str(DataError("plain")) == "plain"
    assert str(DataError("x", shard=2)) == "(shard 2): x"


def test_bad_arguments(tmp_path):
    path = write_jsonl(tmp_path / "a.jsonl", make_records(3))
    with pytest.raises(ValueError, match="on_error"):
        open_dataset(path, on_error="ignore")
    with pytest.raises(ValueError, match="format"):
        open_dataset(path, format="csv")


# ---------------------------------------------------------------- pickling and fingerprint


def _read_in_worker(ds, shard, indices):
    return ds.read(shard, indices)


def test_pickled_dataset_reads_in_copy_and_spawned_process(tmp_path):
    paths = [write_jsonl(tmp_path / "a.jsonl.zst", make_records(8), "zst"),
             write_parquet(tmp_path / "b.parquet", make_records(9, seed=4), row_group_size=4)]
    refs = [reference_jsonl(paths[0]), pq.read_table(paths[1]).to_pylist()]
    ds = open_dataset(paths, name="mix")
    ds.read(0, [1])
    ds.read(1, [1])  # readers now open; they must not be pickled
    copy = pickle.loads(pickle.dumps(ds))
    assert isinstance(copy, Dataset) and copy.shards == ds.shards and copy.name == "mix"
    assert copy.read(0, [7, 0]) == [refs[0][7], refs[0][0]]
    assert copy.read(1, [8, 2, 5]) == [refs[1][i] for i in (8, 2, 5)]
    with mp.get_context("spawn").Pool(1) as pool:
        got = pool.starmap(_read_in_worker, [(ds, 0, [3, 2]), (ds, 1, [6])])
    assert got == [[refs[0][3], refs[0][2]], [refs[1][6]]]


def test_fingerprint_is_json_and_location_independent(tmp_path):
    src, dst = tmp_path / "src", tmp_path / "elsewhere" / "src"
    src.mkdir()
    write_jsonl(src / "a.jsonl", make_records(4))
    write_parquet(src / "b.parquet", make_records(5))
    fp = open_dataset(str(src), columns=["id"]).fingerprint()
    assert json.loads(json.dumps(fp)) == fp
    assert fp == {"name": "src", "columns": ["id"],
                  "shards": [["a.jsonl", 4, os.path.getsize(src / "a.jsonl")],
                             ["b.parquet", 5, os.path.getsize(src / "b.parquet")]]}
    shutil.copytree(src, dst)
    os.utime(dst / "a.jsonl", ns=(1, 1))  # other mtime, same content
    assert open_dataset(str(dst), columns=["id"]).fingerprint() == fp
    with open(dst / "a.jsonl", "ab") as f:
        f.write(b'{"id": 5}\n')
    assert open_dataset(str(dst), columns=["id"]).fingerprint() != fp
