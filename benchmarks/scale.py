"""How the cost of opening a dataset grows: 10^3..10^6 shards and 10^6..10^10 samples (synthetic indexes: shard
sample counts only, no files), per rank of 1,024 ranks over 4,096 lanes.

    python -m benchmarks --only scale [--quick] [--plot docs/img/scale_open.png]

For each (shards, samples) it builds the ``WorkSource`` a rank builds (repeat and one-pass streams) and computes
the first chunk of each of the rank's 4 lanes: the time to that first batch of pointers and the peak Python
memory (tracemalloc). Nothing may grow with the sample count; what grows with the shard count is the shard size
table (8 bytes a shard). See docs/distributed.md, "Scale".
"""
from __future__ import annotations

import argparse
import time
import tracemalloc

import numpy as np

from benchmarks.common import markdown_table, save_panels
from zephon.work import WorkSource
from zephon.work.lanes import lanes_for_rank


class SyntheticDataset:
    """A dataset known by its index alone: ``shards`` shards holding ``samples`` samples in all (as even as
    integers allow). name: str."""

    def __init__(self, name: str, shards: int, samples: int):
        base, extra = divmod(samples, shards)
        self.name = name
        self.shard_sizes = np.full(shards, base, dtype=np.int64)
        self.shard_sizes[:extra] += 1
        self.num_samples = samples

    def fingerprint(self) -> dict:
        return {"name": self.name, "num_shards": int(self.shard_sizes.size), "num_samples": self.num_samples}


def measure(shards: int, samples: int, exhaustion: str, lanes: int = 4096, dp: int = 1024, rank: int = 0,
            block=None) -> dict:
    """Seconds to build the source and the rank's first chunks (untraced), then the peak Python memory (bytes) of
    the same under tracemalloc (which slows numpy's allocations, so it is not timed)."""
    ds = SyntheticDataset("synthetic", shards, samples)  # the index a format reader holds (not counted)

    def first_chunks():
        t0 = time.perf_counter()
        src = WorkSource([ds], seed=0, canonical_replicas=lanes, chunk_size=256, exhaustion=exhaustion,
                         shuffle_block_size=block)
        opened = time.perf_counter() - t0
        n = sum(len(src.chunk(lane, 0)) for lane in lanes_for_rank(lanes, dp, rank))
        return opened, time.perf_counter() - t0, n

    opened, first, n = first_chunks()
    tracemalloc.start()
    first_chunks()
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    return {"shards": shards, "samples": samples, "exhaustion": exhaustion, "block": block, "open_s": opened,
            "first_s": first, "peak": peak, "pointers": n}


def grid(quick: bool):
    """(shards, samples) pairs: every shard count against every sample count with at least one sample a shard."""
    shard_counts = [10 ** 3, 10 ** 6] if quick else [10 ** 3, 10 ** 4, 10 ** 5, 10 ** 6]
    sample_counts = [10 ** 6, 10 ** 10] if quick else [10 ** 6, 10 ** 7, 10 ** 8, 10 ** 9, 10 ** 10]
    return [(s, n) for s in shard_counts for n in sample_counts if n >= s]


def format_rows(rows) -> str:
    """The table in Markdown."""
    return markdown_table(
        ["shards", "samples", "stream<", "open (ms)", "first chunks of a rank (ms)", "peak Python memory (KiB)"],
        [[f"{r['shards']:.0e}", f"{r['samples']:.0e}", r["exhaustion"] + ("" if r["block"] is None else ", blocks"),
          f"{1000 * r['open_s']:.1f}", f"{1000 * r['first_s']:.1f}", f"{r['peak'] / 1024:.0f}"] for r in rows])


def plot(rows, path: str) -> None:
    """Peak memory and time to the first chunks against the sample count, one line per shard count."""
    mem, times = [], []
    for shards in sorted({r["shards"] for r in rows}):
        sel = [r for r in rows if r["shards"] == shards and r["exhaustion"] == "repeat" and r["block"] is None]
        xs, kw = [r["samples"] for r in sel], dict(marker="o", label=f"{shards:.0e} shards")
        mem.append((xs, [r["peak"] / 1024 for r in sel], kw))
        times.append((xs, [1000 * r["first_s"] for r in sel], kw))
    save_panels(path, [("peak Python memory per rank (KiB)", "samples in the dataset", ("log", "log"), mem),
                       ("time to first chunks per rank (ms)", "samples in the dataset", ("log", "log"), times)])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks --only scale", description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--plot", default=None)
    args = ap.parse_args(argv)
    rows = []
    for shards, samples in grid(args.quick):
        for exhaustion, block in (("repeat", None), ("stop", None), ("repeat", 1 << 20)):
            rows.append(measure(shards, samples, exhaustion, block=block))
            print(format_rows(rows[-1:]).splitlines()[-1], flush=True)
    print(format_rows(rows))
    if args.plot:
        plot(rows, args.plot)
    return 0
