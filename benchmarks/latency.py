"""Reads at real latency: Zephon (MDS and Energon) from S3 through a latency proxy, against the same pipeline on
local disk and mosaicml-streaming on the same proxy.

moto's S3 server (own process) holds a zstd MDS dataset and an Energon-prepared text dataset; the tests'
``FaultProxy`` in "latency" mode (tests/s3_server.py) in front of it adds 0, 30 or 80 ms per request and caps
each connection at 50 MB/s. Each row is one epoch in a fresh process with an empty cache:

- MDS: a torch ``DataLoader(num_workers=2, batch_size=32)`` over ``zephon_streaming.StreamingDataset`` (remote
  through the proxy, or the local copy) or ``streaming.StreamingDataset`` (remote through the proxy);
- Energon: Zephon's core ``Loader`` (threads runner, 2 workers, batches of 32) over the dataset at its URL or on
  local disk.

``first batch``: seconds from the constructor to the first batch; ``samples/s``: the whole epoch (constructor
included); ``after the first batch``: what read-ahead must sustain (DataLoader and pump buffers make it noisy
for small datasets). The ratios compare ``samples/s``. One run of each, in one invocation; asserts nothing.

    python -m benchmarks --only latency [--quick]

Prints the table and writes it into docs/benchmarks.md (section "Reads at real latency").
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from .remote import BATCH, REPO, WORKERS, _dataset, start_moto, upload, write_section

START, END = "<!-- latency:start -->", "<!-- latency:end -->"
LATENCIES_MS = (0, 30, 80)
BANDWIDTH = 50e6


sys.path.insert(0, str(REPO / "tests"))  # the tests' dataset builders and S3 proxy


def _energon(root: Path, shards: int, per_shard: int) -> str:
    """An Energon-prepared TextSample dataset of ``shards`` tars (``energon prepare``, split train = all)."""
    import energon_data as E
    out = str(root / "energon")
    E.write_text_tars(out, shards=shards, per_shard=per_shard, extra_json=True)
    return E.energon_prepare(out, {"train": r".*"}, dataset_yaml={
        "sample_type": {"__module__": "megatron.energon", "__class__": "TextSample"}, "field_map": {"text": "txt"}})


def child(which: str, source: str, local: str) -> dict:
    """One epoch of ``which`` (zephon-mds | mosaic | zephon-energon) over ``source``: timings as a dict."""
    t0 = time.perf_counter()
    if which == "zephon-energon":
        from zephon import Batch, Loader
        from zephon.formats import open_dataset
        remote = "://" in source
        ds = open_dataset(source, split_part="train", **({"local": local} if remote else {}))
        loader = Loader([ds], [Batch(BATCH)], seed=0, canonical_replicas=8, global_batch_size=BATCH * 8,
                        shuffle=True, exhaustion="stop", runner="threads", num_workers=WORKERS)
        batches = (len(b["__key__"]) for b in loader)
    else:
        import torch.utils.data as tud
        if which == "zephon-mds":
            from zephon_streaming import StreamingDataset
            kw = {"remote": source, "local": local} if "://" in source else {"local": source}
            ds = StreamingDataset(**kw, batch_size=BATCH, shuffle=True, num_canonical_nodes=8)
        else:
            from streaming import StreamingDataset
            from streaming.base.util import clean_stale_shared_memory
            clean_stale_shared_memory()
            ds = StreamingDataset(remote=source, local=local, batch_size=BATCH, shuffle=True)
        batches = (len(b["id"]) for b in tud.DataLoader(ds, batch_size=BATCH, num_workers=WORKERS))
    first, n0, n = None, 0, 0
    for k in batches:
        n += k
        if first is None:
            first, n0 = time.perf_counter() - t0, n
    total = time.perf_counter() - t0
    return {"first": first, "samples": n, "seconds": total, "rate": n / total,
            "after": (n - n0) / max(total - first, 1e-9)}


def _run(which: str, source: str, local: str, env: dict) -> dict:
    out = subprocess.run([sys.executable, "-m", "benchmarks.latency", which, source, local], env=env,
                         cwd=str(REPO), capture_output=True, text=True, timeout=1800)
    if out.returncode:
        raise RuntimeError(f"{which} {source}: {out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main(workdir: str, quick: bool) -> str:
    """Run every row (``quick``: smaller datasets), print the table, write it into the doc (not when quick)."""
    server, env = start_moto()
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), str(REPO / "adapters"), env.get("PYTHONPATH", "")])
    tmp = Path(tempfile.mkdtemp(prefix="zephon-latency-bench-"))
    rows = []
    try:
        n = 4_000 if quick else 12_000
        mds = _dataset(tmp, n)
        mds_bytes = upload(env, mds, "mds")
        energon = _energon(tmp, 8, 250 if quick else 1000)
        energon_bytes = upload(env, energon, "energon")

        def row(fmt, loader, where, ms, which, source):
            local = str(tmp / f"cache-{len(rows)}")
            r = _run(which, source, local, run_env)
            rows.append((fmt, loader, where, ms, r))
            print(f"  {fmt} {loader} {where} {ms}: {r}", flush=True)

        run_env = env
        row("MDS", "zephon_streaming", "local disk", None, "zephon-mds", mds)
        row("Energon", "zephon Loader", "local disk", None, "zephon-energon", energon)
        for ms in LATENCIES_MS:
            from s3_server import FaultProxy
            proxy = FaultProxy(env["S3_ENDPOINT_URL"], "latency", ms / 1000, BANDWIDTH)
            run_env = dict(env, S3_ENDPOINT_URL=proxy.endpoint)
            try:
                row("MDS", "zephon_streaming", "S3 via proxy", ms, "zephon-mds", "s3://bench/mds")
                row("MDS", "streaming.StreamingDataset", "S3 via proxy", ms, "mosaic", "s3://bench/mds")
                row("Energon", "zephon Loader", "S3 via proxy", ms, "zephon-energon", "s3://bench/energon")
            finally:
                proxy.close()
    finally:
        server.terminate()
        server.wait(30)
        shutil.rmtree(tmp, ignore_errors=True)
    table = _table(rows, n, mds_bytes, energon_bytes, quick)
    print(table)
    if not quick:
        _write(table)
    return table


def _table(rows, n, mds_bytes, energon_bytes, quick) -> str:
    local = {fmt: r["rate"] for fmt, _, where, _, r in rows if where == "local disk"}
    mosaic = {ms: r for fmt, loader, _, ms, r in rows if loader.startswith("streaming.")}
    lines = [f"MDS: {n} samples, {mds_bytes / 2**20:.1f} MiB of zstd shards; Energon: {energon_bytes / 2**20:.1f} "
             f"MiB of tars (incl. .nv-meta). Proxy: fixed latency per request, {BANDWIDTH / 1e6:.0f} MB/s per "
             f"connection. Empty cache per row, one run each (`python -m benchmarks --only latency"
             f"{' --quick' if quick else ''}`).", "",
             "| format | loader | from | latency (ms) | first batch (s) | epoch (s) | samples/s | after the first "
             "batch | vs local disk | vs Mosaic |", "|---|---|---|---:|---:|---:|---:|---:|---:|---:|"]
    for fmt, loader, where, ms, r in rows:
        vs_local = f"{r['rate'] / local[fmt]:.2f}x" if fmt in local else ""
        vs_mosaic = f"{r['rate'] / mosaic[ms]['rate']:.2f}x" if ms in mosaic and fmt == "MDS" else ""
        lines.append(f"| {fmt} | {loader} | {where} | {'' if ms is None else ms} | {r['first']:.2f} | "
                     f"{r['seconds']:.2f} | {r['rate']:,.0f} | {r['after']:,.0f} | {vs_local} | {vs_mosaic} |")
    return "\n".join(lines)


def _write(table: str) -> None:
    write_section(START, END, "Reads at real latency (S3 through a latency proxy)",
                  "Zephon's remote reads against the same pipeline on local disk and mosaicml-streaming on the same "
                  "proxy (benchmarks/latency.py; settings in docs/remote.md, \"Read-ahead\"). One run each on a "
                  "2-core machine that other jobs share: expect large run-to-run variation.", table)


if __name__ == "__main__":
    print(json.dumps(child(*sys.argv[1:4])))
