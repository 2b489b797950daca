"""A thousand ranks in one process: per-rank checkpoints saved by every rank, restored at other dp degrees by
reading only the entries each new rank needs (``zephon.host.load_rank_states``).

    python -m benchmarks --only ranks [--quick] [--lanes-per-rank 4] [--ranks 64,256,1024]

Per rank count: bytes each rank writes, entries and bytes each restoring rank reads, time to its first batch and
its peak Python memory (tracemalloc, on a sample of ranks), for restores at half and twice the rank count.
Prints a table (and, with ``--plot PATH``, a matplotlib plot). Tiny data: one JSONL file, ``Decode`` + ``Batch``.
See docs/distributed.md, "Per-rank checkpoints at scale".
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import time
import tracemalloc

from benchmarks.common import markdown_table, save_panels
from zephon.checkpoint import canonical_json
from zephon.engine import Loader, LoaderPlan
from zephon.formats import open_dataset
from zephon.host import load_rank_states, rank_entries_needed, save_rank_state
from zephon.ops import Batch, Decode


def write_corpus(workdir: str, docs: int = 20_000) -> str:
    """A JSONL file of ``docs`` one-line documents under ``workdir`` (reused if there); returns its directory."""
    d = os.path.join(workdir, f"ranks-corpus-{docs}")
    path = os.path.join(d, "docs.jsonl")
    if not os.path.exists(path):
        os.makedirs(d, exist_ok=True)
        with open(path + ".tmp", "w") as f:
            f.writelines(json.dumps({"text": f"document {i}"}) + "\n" for i in range(docs))
        os.replace(path + ".tmp", path)
    return d


def base_plan(corpus_dir: str, lanes: int, rows_per_lane_step: int = 1) -> LoaderPlan:
    """The dp 1 plan every simulated rank derives its own from (``for_rank``), as a real rank builds it once.

    corpus_dir: ``write_corpus``'s directory. lanes: canonical_replicas. rows_per_lane_step: rows per lane per
    step (2 lets twice as many ranks as lanes share each lane's step)."""
    return LoaderPlan.build([open_dataset(corpus_dir)], [Decode("text"), Batch(1)], canonical_replicas=lanes,
                            chunk_size=4, global_batch_size=lanes * rows_per_lane_step, flush_every_k_chunks=1,
                            seed=0)


def rank_loader(plan: LoaderPlan, dp: int, rank: int) -> Loader:
    """Rank ``rank`` of ``dp``'s loader (inline runner: the simulation is one process)."""
    return Loader.from_plan(plan.for_rank(dp, rank), runner="inline")


def run_rank(loader: Loader, steps: int, on_batch=None, skip: int = 0) -> None:
    """Pull ``steps`` whole rank steps from ``loader`` but the first ``skip`` micro-batches (taken already);
    ``on_batch(mb)`` sees every micro-batch pulled."""
    per_step = len(loader.lanes) * loader.rows_per_rank_step // loader.batch.micro_batch_size
    it = iter(loader)
    for _ in range(steps * per_step - skip):
        mb = next(it)
        if on_batch is not None:
            on_batch(mb)
    it.close()


def save_all(plan: LoaderPlan, dp: int, steps: int, on_batch=None) -> tuple[dict, list[int]]:
    """Run ``dp`` ranks for ``steps`` steps; each saves its own entry. Returns ``({rank: entry JSON bytes},
    bytes written per rank)``."""
    store, written = {}, []
    for r in range(dp):
        L = rank_loader(plan, dp, r)
        run_rank(L, steps, on_batch)
        blob = canonical_json(save_rank_state(L.checkpoint(), dp, r)).encode()
        L.close()
        store[r] = blob
        written.append(len(blob))
    return store, written


def restore_all(plan: LoaderPlan, store: dict, saved_dp: int, new_dp: int, steps: int, on_batch=None,
                mem_ranks=()) -> dict:
    """Every rank of ``new_dp`` restores from only the entries it needs and runs ``steps`` steps.

    store: ``{old rank: entry bytes}``. mem_ranks: ranks whose peak Python memory is traced (tracemalloc slows
    them). Returns per-rank lists ``entries``, ``bytes_read``, ``first_batch_s`` and ``{rank: peak bytes}``
    ``peak``."""
    lanes = plan.canonical_replicas
    out = {"entries": [], "bytes_read": [], "first_batch_s": [], "peak": {}}
    for r in range(new_dp):
        traced = r in mem_ranks
        if traced:
            tracemalloc.start()
        read = []

        def read_entry(old, read=read):
            read.append(len(store[old]))
            return json.loads(store[old])

        t0 = time.perf_counter()
        L = rank_loader(plan, new_dp, r)
        L.restore(load_rank_states(read_entry, saved_dp, new_dp, r, lanes))
        it = iter(L)
        first = next(it)
        out["first_batch_s"].append(time.perf_counter() - t0)
        if traced:
            out["peak"][r] = tracemalloc.get_traced_memory()[1]
            tracemalloc.stop()
        it.close()
        if on_batch is not None:
            on_batch(first)
        if steps:
            run_rank(L, steps, on_batch, skip=1)
        L.close()
        out["entries"].append(len(read))
        out["bytes_read"].append(sum(read))
    return out


def scale_row(plan: LoaderPlan, dp: int, restore_dps, ckpt_step: int = 1, mem_sample: int = 4) -> list[dict]:
    """One table row per restore dp: save at ``dp`` after ``ckpt_step`` steps, restore at each of ``restore_dps``
    and take one batch per rank."""
    t0 = time.perf_counter()
    store, written = save_all(plan, dp, ckpt_step)
    save_s = time.perf_counter() - t0
    rows = []
    for new_dp in restore_dps:
        mem_ranks = set(range(0, new_dp, max(1, new_dp // mem_sample)))
        got = restore_all(plan, store, dp, new_dp, 0, mem_ranks=mem_ranks)
        rows.append({"lanes": plan.canonical_replicas, "saved_dp": dp, "new_dp": new_dp,
                     "written_max": max(written), "written_total": sum(written), "save_s": save_s,
                     "entries_max": max(got["entries"]), "read_max": max(got["bytes_read"]),
                     "first_batch_median_ms": 1000 * statistics.median(got["first_batch_s"]),
                     "first_batch_max_ms": 1000 * max(got["first_batch_s"]),
                     "peak_kib_max": max(got["peak"].values()) / 1024})
    return rows


def format_rows(rows) -> str:
    """The scale table in Markdown."""
    return markdown_table(
        ["lanes", "saved dp", "restore dp", "bytes written / rank (max)", "entries read / rank (max)",
         "bytes read / rank (max)", "first batch / rank (median, max ms)", "peak Python memory / rank (KiB)"],
        [[str(r["lanes"]), str(r["saved_dp"]), str(r["new_dp"]), str(r["written_max"]), str(r["entries_max"]),
          str(r["read_max"]), f"{r['first_batch_median_ms']:.1f}, {r['first_batch_max_ms']:.1f}",
          f"{r['peak_kib_max']:.0f}"] for r in rows])


def plot(rows, path: str) -> None:
    """Bytes and time per rank against the saved rank count."""
    bytes_, times = [], []
    for kind, marker in (("half", "o"), ("double", "s")):
        sel = [r for r in rows if (r["new_dp"] < r["saved_dp"]) == (kind == "half")]
        xs = [r["saved_dp"] for r in sel]
        if kind == "half":
            bytes_.append((xs, [r["written_max"] for r in sel], dict(marker=".", ls="--", c="k", label="written")))
        bytes_.append((xs, [r["read_max"] for r in sel], dict(marker=marker, label=f"read (restore at {kind} dp)")))
        times.append((xs, [r["first_batch_median_ms"] for r in sel],
                      dict(marker=marker, label=f"restore at {kind} dp")))
    x = "ranks saved (lanes = 4 x ranks)"
    save_panels(path, [("checkpoint bytes per rank", x, (("log", {"base": 2}), "linear"), bytes_),
                       ("time to first batch per rank (median, ms)", x, (("log", {"base": 2}), "linear"), times)])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks --only ranks", description=__doc__.split("\n\n")[0])
    ap.add_argument("--workdir", default=None)
    ap.add_argument("--quick", action="store_true", help="64 and 256 ranks only")
    ap.add_argument("--ranks", default="64,128,256,512,1024", help="saved rank counts")
    ap.add_argument("--lanes-per-rank", type=int, default=4)
    ap.add_argument("--plot", default=None, help="save the plot here (PNG)")
    args = ap.parse_args(argv)
    from zephon.demo_corpus import default_workdir

    corpus = write_corpus(args.workdir or default_workdir())
    rows = []
    for dp in ([64, 256] if args.quick else [int(x) for x in args.ranks.split(",")]):
        plan = base_plan(corpus, dp * args.lanes_per_rank)
        rows += scale_row(plan, dp, (dp // 2, dp * 2))
        print("\n".join(format_rows(rows[-2:]).splitlines()[2:]), flush=True)
    print(format_rows(rows))
    if args.plot:
        plot(rows, args.plot)
    return 0


__all__ = ["base_plan", "format_rows", "rank_entries_needed", "restore_all", "save_all", "scale_row",
           "write_corpus"]
