"""Format detection never guesses from a damaged file: a folder with ``index.json`` is MDS, one with ``.nv-meta``
is Energon; a damaged index is a DataError naming the file and what is wrong, and ``zephon inspect`` exits 1."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from zephon import DataError, open_dataset

ROWS = 40


@pytest.fixture
def mds_dir(tmp_path):
    from streaming import MDSWriter

    d = tmp_path / "mds"
    with MDSWriter(out=str(d), columns={"text": "str"}, size_limit=1 << 10) as w:
        for i in range(ROWS):
            w.write({"text": f"document number {i} " * 4})
    return d


def _inspect(path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "zephon.cli", "inspect", str(path), "--no-progress"],
                          capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})


def _damage(index, how):
    text = index.read_text()
    if how == "not json":
        index.write_text("this is not JSON at all\n")
    elif how == "truncated":
        index.write_text(text[:len(text) // 2])
    elif how == "no shards":
        obj = json.loads(text)
        del obj["shards"]
        index.write_text(json.dumps(obj))


def test_intact_mds_is_read_as_mds(mds_dir):
    ds = open_dataset(str(mds_dir))
    assert ds.shards[0].format == "mds" and ds.num_samples == ROWS


@pytest.mark.parametrize("how, says", [("not json", "not valid JSON"), ("truncated", "not valid JSON"),
                                       ("no shards", "'shards' list")])
def test_damaged_mds_index_is_an_error_naming_it(mds_dir, how, says):
    index = mds_dir / "index.json"
    _damage(index, how)
    with pytest.raises(DataError, match=says) as e:
        open_dataset(str(mds_dir))
    assert str(index) in str(e.value)
    r = _inspect(mds_dir)
    assert r.returncode == 1, r.stdout + r.stderr
    assert "index.json" in r.stderr and says in r.stderr
    assert "format jsonl" not in r.stdout


def test_damaged_energon_meta_is_an_error_naming_it(tmp_path):
    from energon_data import text_dataset

    root, _ = text_dataset(str(tmp_path))
    info = os.path.join(root, ".nv-meta", ".info.json")
    with open(info) as f:
        text = f.read()
    with open(info, "w") as f:
        f.write(text[:len(text) // 2])
    with pytest.raises(DataError, match="invalid JSON") as e:
        open_dataset(root)
    assert ".info.json" in str(e.value)
    # .nv-meta as a file (a half-copied dataset) is Energon's, said so, not a folder of tars to guess about
    meta = os.path.join(root, ".nv-meta")
    os.rename(meta, meta + ".bak")
    with open(meta, "w") as f:
        f.write("")
    with pytest.raises(DataError, match="not a directory"):
        open_dataset(root)
    r = _inspect(root)
    assert r.returncode == 1 and "not a directory" in r.stderr, r.stdout + r.stderr
