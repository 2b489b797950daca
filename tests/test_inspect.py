"""`zephon inspect`: every shard checked against its index (issue 15, item 5), `--deep` reads every sample, and the
messages for folders without an index (item 8).

Data comes from the real writers (streaming.MDSWriter, pyarrow, webdataset + `energon prepare`); the expected
sizes, counts and first bad samples are computed here from index.json, the shard header bytes, or the damage the
test did, never by zephon.
"""
from __future__ import annotations

import json
import os
import shutil

import numpy as np
import pytest

from zephon.cli import main


def _mds(out, n=1000, compression=None, size_limit=1 << 20) -> str:
    from streaming import MDSWriter

    with MDSWriter(out=str(out), columns={"text": "str", "id": "int"}, compression=compression,
                   size_limit=size_limit) as w:
        for i in range(n):
            w.write({"text": f"document {i} " + "x" * (3000 + i % 50), "id": i})
    return str(out)


@pytest.fixture(scope="module")
def mds_dir(tmp_path_factory):
    pytest.importorskip("streaming")
    return _mds(tmp_path_factory.mktemp("inspect_mds") / "mds")


def _index(d) -> list[dict]:
    with open(os.path.join(d, "index.json")) as f:
        return json.load(f)["shards"]


def _first_sample_past(path: str, size: int) -> int:
    """Independent of zephon: the first sample whose bytes end past ``size`` (MDS header: uint32 count, offsets)."""
    with open(path, "rb") as f:
        n = int.from_bytes(f.read(4), "little")
        off = np.frombuffer(f.read(4 * (n + 1)), "<u4").astype(np.int64)
    return int(np.flatnonzero(off[1:] > size)[0])


def _inspect(capsys, *argv):
    rc = main(["inspect", *argv, "--no-progress"])
    out, err = capsys.readouterr()
    return rc, out, err


def test_truncated_mds_shard_is_named_with_expected_and_found_size(mds_dir, tmp_path, capsys):
    """The issue's case: a shard cut to 500,000 bytes passed with exit 0 on main."""
    d = shutil.copytree(mds_dir, tmp_path / "mds")
    shards = _index(d)
    assert len(shards) >= 2 and all(s["raw_data"]["bytes"] > 500_000 for s in shards)
    bad = os.path.join(d, shards[0]["raw_data"]["basename"])
    with open(bad, "r+b") as f:
        f.truncate(500_000)
    want = shards[0]["raw_data"]["bytes"]

    rc, out, err = _inspect(capsys, str(d))
    assert rc == 1
    assert f"{bad}  mds  {shards[0]['samples']:,} samples  500,000 bytes  BAD" in out
    assert f"index.json raw_data.bytes says {want:,} bytes, the file has 500,000" in out
    first = _first_sample_past(bad, 500_000)
    assert f"samples {first}-{shards[0]['samples'] - 1})" in out
    assert out.count("  OK") == len(shards) - 1
    assert bad in err and "1 of" in err

    rc, out, _ = _inspect(capsys, str(d), "--deep")
    assert rc == 1
    n_bad = shards[0]["samples"] - first
    assert f"{n_bad:,} of {shards[0]['samples']:,} samples do not read; first bad sample {first}: {bad} " \
           f"(shard 0, sample {first})" in out

    rc, out, _ = _inspect(capsys, str(d), "--json")
    info = json.loads(out)
    assert rc == 1 and info["bad_shards"] == [bad] and not info["ok"]
    assert [s["ok"] for s in info["shards"]] == [False] + [True] * (len(shards) - 1)


def test_mds_header_and_compressed_size_damage_every_bad_shard_named(tmp_path, capsys):
    pytest.importorskip("streaming")
    d = _mds(tmp_path / "z", n=600, compression="zstd", size_limit=1 << 19)
    shards = _index(d)
    assert len(shards) >= 3
    z0 = os.path.join(d, shards[0]["zip_data"]["basename"])
    with open(z0, "r+b") as f:  # compressed file cut short
        f.truncate(shards[0]["zip_data"]["bytes"] // 2)
    # shard 1: a raw copy next to the compressed one whose header counts one sample too many
    raw1 = os.path.join(d, shards[1]["raw_data"]["basename"])
    import zstandard
    with open(os.path.join(d, shards[1]["zip_data"]["basename"]), "rb") as f:
        data = bytearray(zstandard.ZstdDecompressor().decompressobj().decompress(f.read()))
    assert len(data) == shards[1]["raw_data"]["bytes"]
    data[:4] = (shards[1]["samples"] + 1).to_bytes(4, "little")
    with open(raw1, "wb") as f:
        f.write(bytes(data))

    rc, out, err = _inspect(capsys, d, "--cache-dir", str(tmp_path / "cache"))
    assert rc == 1
    half = shards[0]["zip_data"]["bytes"] // 2
    assert f"index.json zip_data.bytes says {shards[0]['zip_data']['bytes']:,} bytes, the file has {half:,}" in out
    assert f"shard header says {shards[1]['samples'] + 1} samples, index.json says {shards[1]['samples']}" in out
    assert z0 in err and raw1 in err and "2 of" in err


def test_jsonl_cut_mid_record_and_a_bad_line_found_by_deep(tmp_path, capsys):
    d = tmp_path / "j"
    d.mkdir()
    lines = [json.dumps({"text": f"doc {i}", "id": i}) for i in range(50)]
    (d / "a.jsonl").write_text("\n".join(lines) + "\n")
    (d / "b.jsonl").write_text("\n".join(lines[:30]) + "\n" + lines[30][:9])  # cut mid-record
    bad_line = list(lines)
    bad_line[17] = '{"text": "doc 17", "id": }'
    (d / "c.jsonl").write_text("\n".join(bad_line) + "\n")

    rc, out, err = _inspect(capsys, str(d))
    assert rc == 1
    assert "sample 30 (line 31): invalid JSON" in out and "file cut mid-record?" in out
    assert str(d / "b.jsonl") in err and str(d / "c.jsonl") not in err  # the middle is read by --deep only

    rc, out, err = _inspect(capsys, str(d), "--deep")
    assert rc == 1
    assert f"1 of 50 samples do not read; first bad sample 17: {d / 'c.jsonl'} (shard 2, sample 17, line 18)" in out
    assert str(d / "b.jsonl") in err and str(d / "c.jsonl") in err and str(d / "a.jsonl") not in err


def _parquet(path, n=100, rg=10):
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"text": [f"row {i} " + "y" * (i % 7) for i in range(n)], "id": list(range(n))}),
                   path, row_group_size=rg, compression="none", use_dictionary=False)
    return pq.ParquetFile(path).metadata


def test_parquet_footer_not_matching_the_file_and_a_bad_row_group(tmp_path, capsys):
    d = tmp_path / "p"
    d.mkdir()
    meta = _parquet(d / "a.parquet")
    _parquet(d / "b.parquet")
    raw = (d / "b.parquet").read_bytes()
    footer = int.from_bytes(raw[-8:-4], "little") + 8
    cut = meta.row_group(9).column(0).data_page_offset + 4  # the last row group's bytes are gone, footer kept
    (d / "b.parquet").write_bytes(raw[:cut] + raw[-footer:])
    _parquet(d / "c.parquet")
    with open(d / "c.parquet", "r+b") as f:  # garbage over row group 3's first page header
        f.seek(meta.row_group(3).column(0).data_page_offset)
        f.write(b"\xff" * 24)

    rc, out, err = _inspect(capsys, str(d))
    assert rc == 1
    assert "row group 9, column 'text'" in out and "outside the data area" in out
    assert str(d / "b.parquet") in err and str(d / "c.parquet") not in err

    rc, out, err = _inspect(capsys, str(d), "--deep")
    assert rc == 1
    assert f"first bad sample 30: {d / 'c.parquet'} (shard 2, sample 30): cannot read row group 3" in out
    assert "10 of 100 samples do not read" in out
    assert str(d / "a.parquet") not in err


@pytest.fixture(scope="module")
def energon_root(tmp_path_factory):
    pytest.importorskip("megatron.energon")
    import energon_data as E

    root = str(tmp_path_factory.mktemp("inspect_energon") / "text")
    E.write_text_tars(root, shards=4, per_shard=6)
    return E.energon_prepare_cli(root, {"train": r".*"}, sample_type="TextSample", field_map={"text": "txt"})


def test_energon_truncated_tars_and_a_damaged_sample(energon_root, tmp_path, capsys):
    root = shutil.copytree(energon_root, tmp_path / "text")
    tars = sorted(f for f in os.listdir(root) if f.endswith(".tar"))
    offs = {t: np.fromfile(os.path.join(root, t + ".idx"), dtype="<u8").astype(np.int64) for t in tars}
    for t in tars[1:3]:  # two tars cut inside their last sample
        with open(os.path.join(root, t), "r+b") as f:
            f.truncate(int(offs[t][-2]) + 700)
    rc, out, err = _inspect(capsys, str(root))
    assert rc == 1
    for t in tars[1:3]:
        size = int(offs[t][-2]) + 700
        assert f"points to byte {int(offs[t][-1])}, past the end of the tar ({size} bytes)" in out
        assert os.path.join(root, t) in err
    assert os.path.join(root, tars[0]) not in err and "2 of 4" in err

    # a damaged member header in the middle of tar 0: only --deep reads it
    shutil.copy(os.path.join(energon_root, tars[1]), os.path.join(root, tars[1]))
    shutil.copy(os.path.join(energon_root, tars[2]), os.path.join(root, tars[2]))
    with open(os.path.join(root, tars[0]), "r+b") as f:
        f.seek(int(offs[tars[0]][3]) + 100)  # inside sample 3's first header (its size / checksum fields)
        f.write(b"\xff" * 60)
    assert _inspect(capsys, str(root))[0] == 0
    rc, out, err = _inspect(capsys, str(root), "--deep")
    assert rc == 1
    assert f"first bad sample 3: {os.path.join(root, tars[0])} (shard 0, sample 3)" in out
    assert "1 of 6 samples do not read" in out


def test_inspect_takes_each_formats_options(energon_root, mds_dir, tmp_path, capsys):
    """`zephon inspect` opens every format with its own flags: Energon split part, MDS split; a flag of
    another format is refused naming the format that takes it."""
    rc, out, _ = _inspect(capsys, energon_root, "--split", "train", "--part-filter", "txt")
    assert rc == 0 and "format energon, 4 shards, 24 samples" in out
    rc, _, err = _inspect(capsys, energon_root, "--split", "val")
    assert rc == 2 and "no split part 'val'" in err
    root = tmp_path / "splits"
    root.mkdir()
    os.symlink(mds_dir, root / "train")
    rc, out, _ = _inspect(capsys, str(root), "--split", "train")
    assert rc == 0 and "format mds" in out and f"{sum(s['samples'] for s in _index(mds_dir)):,} samples" in out
    rc, _, err = _inspect(capsys, mds_dir, "--part-filter", "txt")
    assert rc == 2 and "part_filter applies to Energon datasets only" in err


# -- messages (item 8) -------------------------------------------------------------------------------------


def test_mds_folder_without_index_says_what_it_found_and_what_is_missing(mds_dir, tmp_path, capsys):
    d = tmp_path / "noindex"
    shutil.copytree(mds_dir, d)
    os.remove(d / "index.json")
    rc, _, err = _inspect(capsys, str(d))
    assert rc == 2
    names = sorted(f for f in os.listdir(d))
    assert f"found {len(names)} files ({names[0]}" in err
    assert "MDS shards" in err and "index.json" in err and "streaming.MDSWriter" in err


def test_tar_folder_without_nv_meta_says_run_energon_prepare(tmp_path, capsys):
    pytest.importorskip("webdataset")
    import energon_data as E

    d = str(tmp_path / "tars")
    E.write_text_tars(d, shards=2, per_shard=3)
    rc, _, err = _inspect(capsys, d)
    assert rc == 2
    assert "found 2 files (text-000.tar, text-001.tar)" in err and "energon prepare" in err and ".nv-meta" in err


def test_empty_folder_and_forced_format_say_what_is_there(tmp_path, capsys):
    (tmp_path / "e").mkdir()
    rc, _, err = _inspect(capsys, str(tmp_path / "e"))
    assert rc == 2 and "it holds no files" in err and "index.json" in err and ".nv-meta" in err
    _parquet(tmp_path / "e" / "a.parquet", n=3, rg=3)
    rc, _, err = _inspect(capsys, str(tmp_path / "e"), "--format", "jsonl")
    assert rc == 2 and "no jsonl files in directory: found 1 file (a.parquet), none read as jsonl" in err


def test_inspect_at_s3_every_format_and_a_truncated_object(s3, mds_dir, energon_root, tmp_path, capsys):
    """Object storage through zephon/formats/remote (moto): MDS, JSONL + Parquet files and Energon are checked
    like local data; an MDS shard object shorter than index.json says is named."""
    d = tmp_path / "files"
    d.mkdir()
    (d / "a.jsonl").write_text("".join(json.dumps({"text": f"t{i}"}) + "\n" for i in range(20)))
    _parquet(d / "b.parquet", n=30, rg=8)
    files_url = s3.upload_dir(str(d), "files")
    rc, out, _ = _inspect(capsys, files_url, "--local", str(tmp_path / "c1"))
    assert rc == 0 and "format mixed, 2 shards, 50 samples" in out and "all OK" in out
    rc, out, _ = _inspect(capsys, s3.upload_dir(energon_root, "text"), "--deep", "--local", str(tmp_path / "c2"))
    assert rc == 0 and "format energon, 4 shards, 24 samples" in out
    bad = shutil.copytree(mds_dir, tmp_path / "mds")
    shards = _index(bad)
    with open(os.path.join(bad, shards[-1]["raw_data"]["basename"]), "r+b") as f:
        f.truncate(1000)
    url = s3.upload_dir(str(bad), "mds")
    rc, out, err = _inspect(capsys, url, "--local", str(tmp_path / "c3"), "--download-retry", "0")
    assert rc == 1
    assert f"{url}/{shards[-1]['raw_data']['basename']}" in err and f"1 of {len(shards)}" in err
    assert out.count("  OK") == len(shards) - 1


def test_every_file_that_does_not_open_is_named_and_exits_1(mds_dir, tmp_path, capsys):
    """A dataset whose files do not open (truncated Parquet footers, an empty JSONL beside good files, an MDS
    shard listed in index.json but missing) is a bad dataset: exit 1, every bad file named, not only the first."""
    d = tmp_path / "multi"
    d.mkdir()
    for name in ("a", "b", "c"):
        _parquet(d / f"{name}.parquet", n=5, rg=1)
    for name in ("b", "c"):  # the footer's last 100 bytes cut off
        p = d / f"{name}.parquet"
        p.write_bytes(p.read_bytes()[:-100])
    rc, _, err = _inspect(capsys, str(d))
    assert rc == 1, err
    assert "b.parquet" in err and "c.parquet" in err and "a.parquet" not in err
    assert "2 of the dataset's files do not open" in err
    m = tmp_path / "mds_missing"
    shutil.copytree(mds_dir, m)
    shard = sorted(f for f in os.listdir(m) if f.endswith(".mds"))[-1]
    os.remove(m / shard)
    rc, _, err = _inspect(capsys, str(m))
    assert rc == 1 and shard in err and "missing" in err, err


def test_deep_checks_the_text_field_of_every_sample(tmp_path, capsys):
    """--deep refuses what the Loader's Decode(--field) would refuse: a JSONL record without the field (its line
    named: a blank line before it), a null text, a Parquet file without the column; --field names another one."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    d = tmp_path / "fields"
    d.mkdir()
    lines = [json.dumps({"text": f"doc {i}", "body": f"b {i}"}) for i in range(20)]
    lines[7] = json.dumps({"txt": "doc 7", "body": "b 7"})
    (d / "a.jsonl").write_text("\n".join(lines[:3] + [""] + lines[3:]) + "\n")  # sample 7 is on line 9
    nulls = list(lines)
    nulls[7] = json.dumps({"text": "doc 7", "body": "b 7"})
    nulls[12] = json.dumps({"text": None, "body": "b 12"})
    (d / "b.jsonl").write_text("\n".join(nulls) + "\n")
    pq.write_table(pa.table({"body": [f"row {i}" for i in range(5)]}), d / "c.parquet")

    rc, out, err = _inspect(capsys, str(d), "--deep")
    assert rc == 1
    assert f"first bad sample 7: {d / 'a.jsonl'} (shard 0, sample 7, line 9): missing field 'text'" in out
    assert f"first bad sample 12: {d / 'b.jsonl'} (shard 1, sample 12, line 13): field 'text' is NoneType" in out
    assert f"5 of 5 samples do not read; first bad sample 0: {d / 'c.parquet'} (shard 2, sample 0)" in out
    assert "3 of 3 shards bad" in err
    rc, out, err = _inspect(capsys, str(d), "--deep", "--field", "body")
    assert rc == 0 and "all OK" in out


def test_a_shard_the_store_never_answers_for_is_unreachable_not_bad(s3, mds_dir, tmp_path, capsys, monkeypatch):
    """A network failure is not bad data (docs/remote.md): the shard whose GET is swallowed by the proxy is
    reported unreachable with its object URL and the error; the exit code (3) says the data could not be checked."""
    from s3_server import FaultProxy

    url = s3.upload_dir(mds_dir, "mds")
    shards = _index(mds_dir)
    hung = shards[1]["raw_data"]["basename"]
    proxy = FaultProxy(s3.endpoint)
    proxy.hang_if = hung
    monkeypatch.setenv("S3_ENDPOINT_URL", proxy.endpoint)
    try:
        rc, out, err = _inspect(capsys, url, "--local", str(tmp_path / "c"), "--download-timeout", "1",
                                "--download-retry", "0")
    finally:
        proxy.close()
    assert rc == 3, err
    assert "bad" not in err.replace("not bad data", "")
    assert f"1 of {len(shards)} shards could not be checked" in err and f"{url}/{hung}" in err
    assert "UNREACHABLE" in out and out.count("  OK") == len(shards) - 1


def test_a_cache_limit_smaller_than_a_shard_is_a_usage_error_before_any_shard_is_read(s3, mds_dir, tmp_path,
                                                                                      capsys, monkeypatch):
    """`--cache-limit 10` cannot hold any shard: one usage error (exit 2) naming the flag and what a shard
    needs, not "N of N shards bad"; no shard object is fetched (the proxy's request log)."""
    from s3_server import FaultProxy

    url = s3.upload_dir(mds_dir, "mds")
    shards = _index(mds_dir)
    proxy = FaultProxy(s3.endpoint)
    monkeypatch.setenv("S3_ENDPOINT_URL", proxy.endpoint)
    try:
        with pytest.raises(SystemExit) as e:
            main(["inspect", url, "--local", str(tmp_path / "c"), "--cache-limit", "10", "--no-progress"])
    finally:
        proxy.close()
    out, err = capsys.readouterr()
    assert e.value.code == 2 and "usage: zephon inspect" in err and "shards bad" not in err
    first = shards[0]["raw_data"]
    assert f"--cache-limit 10: {url}/{first['basename']}: needs {first['bytes']} bytes" in err, err
    shard_gets = [p for m, p in proxy.requests if m == "GET" and p.endswith(".mds")]
    assert shard_gets == []


def test_energon_tar_missing_is_bad_data_named_like_a_missing_mds_shard(energon_root, tmp_path, capsys):
    """A tar .nv-meta lists but the folder lacks is a bad dataset (exit 1 naming the tar), as a missing MDS shard
    is (test above), not an argument error (exit 2)."""
    root = shutil.copytree(energon_root, tmp_path / "text")
    tars = sorted(f for f in os.listdir(root) if f.endswith(".tar"))
    os.remove(os.path.join(root, tars[2]))
    rc, _, err = _inspect(capsys, str(root))
    assert rc == 1, err
    assert os.path.join(root, tars[2]) in err and "missing" in err
    assert "1 of the dataset's files does not open" in err and "zephon: error" not in err


def test_energon_tar_missing_from_a_bucket_is_bad_data_named_by_url(s3, energon_root, tmp_path, capsys):
    root = shutil.copytree(energon_root, tmp_path / "text")
    tars = sorted(f for f in os.listdir(root) if f.endswith(".tar"))
    os.remove(os.path.join(root, tars[1]))
    url = s3.upload_dir(str(root), "text")
    rc, _, err = _inspect(capsys, url, "--local", str(tmp_path / "c"))
    assert rc == 1, err
    assert f"{url}/{tars[1]}" in err and "missing" in err and "1 of the dataset's files does not open" in err
