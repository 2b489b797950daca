"""Remote MDS: samples/s of zephon_streaming against mosaicml-streaming on the same S3 server, cold and warm cache.

One moto S3 server (``moto.server`` in its own process on 127.0.0.1, a free port) holds an MDSWriter dataset
(zstd shards, sha1 hashes). Each row is one epoch in a fresh process: a torch ``DataLoader`` with the same
workers and batch size over ``zephon_streaming.StreamingDataset`` or ``streaming.StreamingDataset``
(``remote=s3://...``, ``shuffle=True``, ``validate_hash="sha1"``); "cold" starts from an empty ``local``, "warm"
reuses the cache the cold run left. ``first batch`` is the time from the constructor to the first batch;
``samples/s`` counts the whole epoch (constructor included). One run of each, in one invocation.

    python -m benchmarks --only remote [--quick]

Prints a table and writes it into docs/benchmarks.md (section "Remote MDS"); asserts nothing.
"""
from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
START, END = "<!-- remote:start -->", "<!-- remote:end -->"
BATCH, WORKERS = 32, 2


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _dataset(root: Path, n: int) -> str:
    import random

    from streaming import MDSWriter
    rng = random.Random(0)
    vocab = ["".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(rng.randint(2, 9))) for _ in range(5000)]
    out = root / "mds"
    with MDSWriter(out=str(out), columns={"id": "int", "text": "str"}, compression="zstd", hashes=["sha1"],
                   size_limit=1 << 20) as w:
        for i in range(n):  # about 1 KB of text per sample, compressing like prose (about 2.5x)
            w.write({"id": i, "text": " ".join(rng.choices(vocab, k=120 + i % 80))})
    return str(out)


def child(which: str, url: str, local: str) -> dict:
    """One epoch of ``which`` ("zephon" | "mosaic") over ``url`` through ``local``: timings as a dict."""
    import torch.utils.data as tud
    t0 = time.perf_counter()
    if which == "zephon":
        from zephon_streaming import StreamingDataset
        ds = StreamingDataset(remote=url, local=local, batch_size=BATCH, shuffle=True, validate_hash="sha1",
                              num_canonical_nodes=8)
    else:
        from streaming import StreamingDataset
        from streaming.base.util import clean_stale_shared_memory
        clean_stale_shared_memory()
        ds = StreamingDataset(remote=url, local=local, batch_size=BATCH, shuffle=True, validate_hash="sha1")
    first, n = None, 0
    for b in tud.DataLoader(ds, batch_size=BATCH, num_workers=WORKERS):
        if first is None:
            first = time.perf_counter() - t0
        n += len(b["id"])
    total = time.perf_counter() - t0
    return {"first": first, "samples": n, "seconds": total, "rate": n / total}


def start_moto() -> tuple[subprocess.Popen, dict]:
    """moto's S3 server in its own process on a free port of 127.0.0.1, with bucket ``bench``:
    ``(process, environment for clients)`` (test credentials, ``S3_ENDPOINT_URL``)."""
    env = dict(os.environ, AWS_ACCESS_KEY_ID="bench", AWS_SECRET_ACCESS_KEY="bench", AWS_DEFAULT_REGION="us-east-1")
    port = _free_port()
    env["S3_ENDPOINT_URL"] = f"http://127.0.0.1:{port}"
    server = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)], env=env,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 30
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            break
        except OSError:
            if time.time() > deadline:
                server.terminate()
                raise
            time.sleep(0.1)
    s3_client(env).create_bucket(Bucket="bench")
    return server, env


def s3_client(env: dict):
    """A boto3 client of the benchmark's server."""
    import boto3
    return boto3.client("s3", endpoint_url=env["S3_ENDPOINT_URL"], region_name="us-east-1",
                        aws_access_key_id="bench", aws_secret_access_key="bench")


def upload(env: dict, src: str, prefix: str) -> int:
    """Upload every file below ``src`` to ``s3://bench/<prefix>/``; returns the bytes uploaded."""
    c, size = s3_client(env), 0
    for d, _, fs in os.walk(src):
        for f in fs:
            full = os.path.join(d, f)
            c.upload_file(full, "bench", f"{prefix}/{os.path.relpath(full, src).replace(os.sep, '/')}")
            size += os.path.getsize(full)
    return size


def main(workdir: str, quick: bool) -> str:
    """Run the comparison (``quick``: a quarter of the samples), print the table, write it into the doc."""
    server, env = start_moto()
    tmp = Path(tempfile.mkdtemp(prefix="zephon-remote-bench-"))
    try:
        n = 5_000 if quick else 20_000
        src = _dataset(tmp, n)
        size = upload(env, src, "mds")
        url = "s3://bench/mds"
        rows = []
        for which in ("zephon", "mosaic"):
            local = str(tmp / f"local-{which}")
            for cache in ("cold", "warm"):
                out = subprocess.run([sys.executable, "-m", "benchmarks.remote", which, url, local], env=env,
                                     cwd=str(REPO), capture_output=True, text=True, timeout=1800)
                if out.returncode:
                    raise RuntimeError(f"{which} {cache}: {out.stderr[-2000:]}")
                r = json.loads(out.stdout.strip().splitlines()[-1])
                rows.append((which, cache, r))
                print(f"  {which} {cache}: {r}", flush=True)
    finally:
        server.terminate()
        server.wait(30)
        shutil.rmtree(tmp, ignore_errors=True)
    names = {"zephon": "zephon_streaming", "mosaic": "streaming.StreamingDataset"}
    lines = [f"{n} samples in {size / 2**20:.1f} MiB of zstd MDS shards on moto's S3 server (127.0.0.1), "
             f"`DataLoader(num_workers={WORKERS}, batch_size={BATCH})`, `shuffle=True`, `validate_hash=\"sha1\"`; "
             f"one epoch per row, one run each (`python -m benchmarks --only remote{' --quick' if quick else ''}`).",
             "", "| loader | cache | first batch (s) | epoch (s) | samples/s |", "|---|---|---:|---:|---:|"]
    for which, cache, r in rows:
        lines.append(f"| {names[which]} | {cache} | {r['first']:.2f} | {r['seconds']:.2f} | {r['rate']:,.0f} |")
    table = "\n".join(lines)
    print(table)
    if not quick:
        _write(table)
    return table


def _write(table: str) -> None:
    write_section(START, END, "Remote MDS (S3)",
                  "Reading an MDS dataset from an S3-compatible server through the local cache (docs/remote.md): "
                  "cold (empty `local`) and warm (the cold run's cache). One run each on a 2-core machine that other "
                  "jobs share: expect large run-to-run variation.", table)


def write_section(start: str, end: str, title: str, intro: str, table: str) -> None:
    """Put section ``title`` (``intro``, then ``table``) between the markers ``start`` / ``end`` of
    docs/benchmarks.md (appended when they are not there yet)."""
    doc = REPO / "docs" / "benchmarks.md"
    text = doc.read_text(encoding="utf-8")
    section = f"{start}\n## {title}\n\n{intro}\n\n{table}\n{end}"
    if start in text and end in text:
        text = text[:text.index(start)] + section + text[text.index(end) + len(end):]
    else:
        text = text.rstrip("\n") + "\n\n" + section + "\n"
    doc.write_text(text, encoding="utf-8")


if __name__ == "__main__":
    print(json.dumps(child(*sys.argv[1:4])))
