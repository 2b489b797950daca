"""Every wait on object storage is bounded, and a killed download leaves nothing behind (issue 24, items 4-5).

A plain socket server (``Silent``) accepts connections and reads requests but never answers: listing a prefix,
a HEAD of an object and a GET in the middle of a pass must each fail within ``download_timeout x
(download_retry + 1)`` plus the backoff, naming the URL and what was waited for. Oracles: the elapsed time,
the bytes and ids written by the test.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from zephon.formats import open_dataset
from zephon.formats import remote as zr

from s3_server import BUCKET, CREDENTIALS, FaultProxy

RETRY, TIMEOUT = 1, 1.0
BOUND = (RETRY + 1) * TIMEOUT + zr.fetch.BACKOFF  # what docs/remote.md promises
SLACK = 1.5  # interpreter and client start-up on a shared 2-core machine


@pytest.fixture
def silent(s3):
    """A plain socket server that accepts, reads, and never answers."""
    srv = FaultProxy(None)
    yield srv
    srv.close()


def _timed(fn):
    t0 = time.monotonic()
    with pytest.raises(zr.RemoteError) as e:
        fn()
    return time.monotonic() - t0, str(e.value)


@pytest.mark.parametrize("key, first", [("some/prefix", "some/prefix/.nv-meta/.info.json: HEAD (format detection)"),
                                         ("x/a.jsonl", "x/a.jsonl: HEAD")])
def test_opening_on_a_silent_server_fails_within_the_bound(silent, monkeypatch, tmp_path, key, first):
    monkeypatch.setenv("S3_ENDPOINT_URL", silent.endpoint)
    url = f"s3://{BUCKET}/{key}"
    took, msg = _timed(lambda: open_dataset(url, local=str(tmp_path / "c"), download_retry=RETRY,
                                            download_timeout=TIMEOUT))
    assert took < BOUND + SLACK, (took, msg)
    assert msg.startswith(f"s3://{BUCKET}/{first} failed after {RETRY + 1} attempt(s)"), msg
    assert f"download_retry={RETRY}, download_timeout=1s" in msg and "Timeout" in msg, msg


def test_a_server_going_silent_mid_pass_fails_within_the_bound(silent, s3, monkeypatch, tmp_path):
    lines = b"".join(b'{"id": %d}\n' % i for i in range(40))
    url_a, url_b = s3.put("m/a.jsonl", lines), s3.put("m/b.jsonl", lines)
    ds = open_dataset(f"s3://{BUCKET}/m", local=str(tmp_path / "c"), download_retry=RETRY, download_timeout=TIMEOUT)
    assert [r["id"] for r in ds.read(0, range(40))] == list(range(40))
    os.remove(tmp_path / "c" / "b.jsonl")  # evicted: the pass fetches it again (opening counted both files)
    monkeypatch.setenv("S3_ENDPOINT_URL", silent.endpoint)
    took, msg = _timed(lambda: list(ds.read(1, range(40))))
    assert took < BOUND + SLACK, (took, msg)
    assert msg.startswith(url_b + ": download failed after 2 attempt(s)") and url_a != url_b, msg


_CHILD = """
import sys
from zephon.formats.remote import RemoteRoot
root = RemoteRoot(sys.argv[1], local=sys.argv[2], download_timeout=60)
root.ensure("big.jsonl", int(sys.argv[3]))
"""


def test_a_download_killed_leaves_no_temporary_file_after_the_next_open(s3, tmp_path):
    n = 60000
    data = b"".join(b'{"id": %6d}\n' % i for i in range(n))  # ~830 KB
    s3.put("k/big.jsonl", data)
    proxy = FaultProxy(s3.endpoint, mode="slow", delay=0.05)  # ~15 responses chunks a second: a slow download
    local = str(tmp_path / "c")
    env = dict(os.environ, S3_ENDPOINT_URL=proxy.endpoint, **CREDENTIALS,
               PYTHONPATH=os.pathsep.join([os.getcwd(), os.path.join(os.getcwd(), "adapters")]))
    child = subprocess.Popen([sys.executable, "-c", _CHILD, f"s3://{BUCKET}/k", local, str(len(data))], env=env)
    try:
        deadline = time.monotonic() + 60
        tmps: list = []
        while not tmps and time.monotonic() < deadline and child.poll() is None:
            time.sleep(0.05)
            tmps = [f for f in os.listdir(local) if f.endswith(".tmp")] if os.path.isdir(local) else []
        assert tmps, "the child never started its download"
        os.kill(child.pid, signal.SIGKILL)
        child.wait(30)
    finally:
        proxy.close()
        if child.poll() is None:
            child.kill()
    assert os.path.getsize(os.path.join(local, tmps[0])) == len(data)  # its room was taken at full size
    ds = open_dataset(f"s3://{BUCKET}/k/big.jsonl", local=local)  # no cache_limit
    assert not [f for f in os.listdir(local) if f.endswith(".tmp")]
    assert [r["id"] for r in ds.read(0, range(n))] == list(range(n))
