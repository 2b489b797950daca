"""Reads at real latency: Zephon (MDS and Energon) from S3 through a latency proxy, against the same pipeline on
local disk and mosaicml-streaming on the same proxy.

moto's S3 server (own process) holds a zstd MDS dataset (120,000 samples, ~47 MiB) and an Energon-prepared text
dataset (96,000 samples); the tests' ``FaultProxy`` in "latency" mode (tests/s3_server.py) in front of it adds
30 or 80 ms per request and caps each connection at 50 MB/s. Each run is one epoch in a fresh process with an
empty cache:

- MDS: a torch ``DataLoader(num_workers=2, batch_size=32)`` over ``zephon_streaming.StreamingDataset`` (remote
  through the proxy, or the local copy) or ``streaming.StreamingDataset`` (remote through the proxy);
- Energon: Zephon's core ``Loader`` (threads runner, 2 workers, batches of 32) over the dataset at its URL or on
  local disk.

The datasets are sized so that the phase after the first batch lasts over 10 s on local disk. ``ROUNDS`` rounds
run every configuration once each (interleaved, the order rotated per round, so a slow spell of the shared
machine hits every configuration alike); the table gives the median of the rounds and their spread (min-max).

Every row's rates are computed alike: ``first batch``: seconds from the constructor to the first batch;
``after the first batch``: samples after the first batch / seconds from the first batch to the end of the epoch
(the steady rate read-ahead must sustain); ``epoch``: all samples / seconds from the constructor to the end.
``vs local disk`` and ``vs Mosaic`` compare the medians of ``after the first batch``. Asserts nothing.

    python -m benchmarks --only latency [--quick]

``--quick``: one round over a quarter of the data (a smoke run; the doc is not written). Prints the table and
writes it into docs/benchmarks.md (section "Reads at real latency").
"""
from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from .remote import BATCH, REPO, WORKERS, _dataset, start_moto, upload, write_section

START, END = "<!-- latency:start -->", "<!-- latency:end -->"
LATENCIES_MS = (30, 80)
BANDWIDTH = 50e6
ROUNDS = 3
MDS_SAMPLES = 120_000          # ~47 MiB of zstd shards: > 10 s after the first batch on local disk
ENERGON = (48, 2000)           # tars x samples per tar


sys.path.insert(0, str(REPO / "tests"))  # the tests' dataset builders and S3 proxy


def _energon(root: Path, shards: int, per_shard: int) -> str:
    """An Energon-prepared TextSample dataset of ``shards`` tars (``energon prepare``, split train = all)."""
    import energon_data as E
    out = str(root / "energon")
    E.write_text_tars(out, shards=shards, per_shard=per_shard, extra_json=False)  # the .txt is read
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


def _configs(mds: str, energon: str) -> list[tuple]:
    """Every configuration: ``(format, loader, from, latency ms or None, child kind, source)``."""
    rows = [("MDS", "zephon_streaming", "local disk", None, "zephon-mds", mds),
            ("Energon", "zephon Loader", "local disk", None, "zephon-energon", energon)]
    for ms in LATENCIES_MS:
        rows += [("MDS", "zephon_streaming", "S3 via proxy", ms, "zephon-mds", "s3://bench/mds"),
                 ("MDS", "streaming.StreamingDataset", "S3 via proxy", ms, "mosaic", "s3://bench/mds"),
                 ("Energon", "zephon Loader", "S3 via proxy", ms, "zephon-energon", "s3://bench/energon")]
    return rows


def main(workdir: str, quick: bool) -> str:
    """Run ``ROUNDS`` interleaved rounds of every configuration (``quick``: one round, a quarter of the data),
    print the table, write it into the doc (not when quick)."""
    from s3_server import FaultProxy
    server, env = start_moto()
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), str(REPO / "adapters"), env.get("PYTHONPATH", "")])
    tmp = Path(tempfile.mkdtemp(prefix="zephon-latency-bench-"))
    proxies = {}
    try:
        n, (shards, per_shard) = (MDS_SAMPLES // 4, (ENERGON[0] // 4, ENERGON[1])) if quick else (MDS_SAMPLES, ENERGON)
        mds = _dataset(tmp, n)
        mds_bytes = upload(env, mds, "mds")
        energon = _energon(tmp, shards, per_shard)
        energon_bytes = upload(env, energon, "energon")
        for ms in LATENCIES_MS:
            proxies[ms] = FaultProxy(env["S3_ENDPOINT_URL"], "latency", ms / 1000, BANDWIDTH)
        configs = _configs(mds, energon)
        results: dict = {c: [] for c in configs}
        rounds = 1 if quick else ROUNDS
        for k in range(rounds):
            order = configs[k % len(configs):] + configs[:k % len(configs)]  # rotated: no fixed position
            for c in order:
                fmt, loader, where, ms, which, source = c
                run_env = env if ms is None else dict(env, S3_ENDPOINT_URL=proxies[ms].endpoint)
                r = _run(which, source, str(tmp / f"cache-{k}-{configs.index(c)}"), run_env)
                shutil.rmtree(tmp / f"cache-{k}-{configs.index(c)}", ignore_errors=True)
                results[c].append(r)
                print(f"  round {k + 1}/{rounds} {fmt} {loader} {where} {ms}: first {r['first']:.2f}s, after "
                      f"{r['after']:,.0f}/s, epoch {r['seconds']:.1f}s", flush=True)
    finally:
        for p in proxies.values():
            p.close()
        server.terminate()
        server.wait(30)
        shutil.rmtree(tmp, ignore_errors=True)
    table = _table(results, n, mds_bytes, energon_bytes, rounds, quick)
    print(table)
    if not quick:
        _write(table)
    return table


def _table(results: dict, n: int, mds_bytes: int, energon_bytes: int, rounds: int, quick: bool) -> str:
    """The markdown table: per configuration the medians over the rounds, and the spread of the after-rate."""
    med = {c: {k: statistics.median([r[k] for r in rs]) for k in ("first", "seconds", "rate", "after", "samples")}
           for c, rs in results.items()}
    local = {c[0]: med[c]["after"] for c in results if c[2] == "local disk"}
    mosaic = {c[3]: med[c] for c in results if c[1].startswith("streaming.")}
    energon_n = next(int(med[c]["samples"]) for c in results if c[0] == "Energon")
    lines = [f"MDS: {n:,} samples, {mds_bytes / 2**20:.1f} MiB of zstd shards; Energon: {energon_n:,} samples, "
             f"{energon_bytes / 2**20:.1f} MiB of tars (incl. .nv-meta). Proxy: fixed latency per request, "
             f"{BANDWIDTH / 1e6:.0f} MB/s per connection. Empty cache per run; {rounds} interleaved round(s), "
             f"median shown, spread = min-max of the after-first-batch rate over the rounds "
             f"(`python -m benchmarks --only latency{' --quick' if quick else ''}`).", "",
             "| format | loader | from | latency (ms) | first batch (s) | epoch (s) | after the first batch "
             "(samples/s) | spread | vs local disk | vs Mosaic |", "|---|---|---|---:|---:|---:|---:|---:|---:|---:|"]
    for c, rs in results.items():
        fmt, loader, where, ms = c[:4]
        m = med[c]
        after = sorted(r["after"] for r in rs)
        vs_local = f"{m['after'] / local[fmt]:.2f}x" if fmt in local else ""
        vs_mosaic = f"{m['after'] / mosaic[ms]['after']:.2f}x" if ms in mosaic and fmt == "MDS" else ""
        lines.append(f"| {fmt} | {loader} | {where} | {'' if ms is None else ms} | {m['first']:.2f} | "
                     f"{m['seconds']:.2f} | {m['after']:,.0f} | {after[0]:,.0f}-{after[-1]:,.0f} | {vs_local} | "
                     f"{vs_mosaic} |")
    return "\n".join(lines)


def _write(table: str) -> None:
    write_section(START, END, "Reads at real latency (S3 through a latency proxy)",
                  "Zephon's remote reads against the same pipeline on local disk and mosaicml-streaming on the same "
                  "proxy (benchmarks/latency.py; settings in docs/remote.md, \"Read-ahead\"). The goal (issue 24): "
                  "after the first batch, >= 0.8x the local-disk rate and at least Mosaic's; the first batch within "
                  "2x Mosaic's. Measured on a 2-core machine shared with other jobs (the S3 server and the proxy "
                  "share those cores too): read the spread before the ratios. A ratio above 1.00x is no mistake: "
                  "on local disk the MDS reader decompresses each zstd shard on its first read, in the reading "
                  "thread, while remote shards are downloaded and decompressed by read-ahead threads before the "
                  "read.", table)


if __name__ == "__main__":
    print(json.dumps(child(*sys.argv[1:4])))
