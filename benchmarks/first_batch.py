"""Time and reads to the first global batch against the lane count, cold and after a restore (issue 32).

    python -m benchmarks --only first-batch [--quick] [--workdir DIR]
    python -m benchmarks.first_batch --root /path/to/other/checkout   # the same table for another checkout

Each measurement runs in a child process (``--child``) with ``PYTHONPATH`` on a checkout (this one, or ``--root``:
e.g. an older commit unpacked by ``git archive``), so before/after numbers come from the same script. Reads are
counted by wrapping the dataset's ``read`` (documents or samples handed to the workers), consumption from the
first global batch itself (documents in its rows: ``position_ids`` restarts; samples: one per row). Prints only.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent  # no package import: the child runs as a script under another checkout

TAG = "@@first-batch "
LANES = (8, 64, 512)
KINDS = ("text", "text-pack", "energon")  # one row per document; Tokenize + Pack(2048); vision-language samples


def _text_corpus(workdir: Path, n: int = 20000) -> tuple[str, str]:
    """``(jsonl dir, tokenizer.json)``: ``n`` paragraphs of the standard library's sources (~100 tokens on average),
    and a byte-level BPE (4,096 tokens) trained on them. Built once per workdir."""
    import sysconfig

    root = workdir / "first-batch-paragraphs"
    tok = workdir / "first-batch-bpe4096.json"
    if not (root / "done").exists():
        root.mkdir(parents=True, exist_ok=True)
        texts = []
        for p in sorted(Path(sysconfig.get_paths()["stdlib"]).glob("*.py")):
            body = p.read_text(encoding="utf-8", errors="replace")
            texts += [b for b in body.split("\n\n") if 40 <= len(b) <= 2000]  # paragraphs, ~100 tokens on average
            if len(texts) >= n:
                break
        texts = (texts * (n // max(1, len(texts)) + 1))[:n]
        for s in range(4):
            with open(root / f"part-{s}.jsonl", "w") as fh:
                for t in texts[s::4]:
                    fh.write(json.dumps({"text": t}) + "\n")
        from tokenizers import Tokenizer, models, pre_tokenizers, trainers

        t = Tokenizer(models.BPE(unk_token="<unk>"))
        t.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        trainer = trainers.BpeTrainer(vocab_size=4096, special_tokens=["<pad>", "<eos>", "<unk>"],
                                      initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
        t.train_from_iterator(texts[:5000], trainer)
        t.save(str(tok))
        (root / "done").write_text("ok")
    return str(root), str(tok)


def _vl_corpus(workdir: Path, n: int) -> str:
    """An Energon captioning dataset of ``n`` natural-looking JPEGs (tests/vl_data.py), built once."""
    root = workdir / f"first-batch-vl-{n}"
    if not (root / "done").exists():
        from .common import tests_module

        tests_module("vl_data").write_energon(str(root), n)
        (root / "done").write_text("ok")
    return str(root)


class Counter:
    """Counts what a dataset's ``read`` hands out (thread-safe enough: one += per call under the GIL)."""

    def __init__(self, ds):
        self.n = 0
        inner = ds.read

        def read(shard, idx):
            self.n += len(idx)
            return inner(shard, idx)
        ds.read = read


def _text_loader(lanes: int, root: str, tok: str, pack: bool):
    """A core Loader, threads runner: Tokenize + Pack(2048) + Batch(1) (``pack``), else one row per document."""
    from zephon.engine import Loader
    from zephon.formats import open_dataset
    from zephon.ops import Batch, Decode, Pack, Tokenize

    ds = open_dataset(root)
    ops = [Decode("text"), Tokenize(tok, eos_id="<eos>", max_length=2048)] + [Pack(2048)] * pack + [Batch(1)]
    return ds, Loader([ds], ops, canonical_replicas=lanes, global_batch_size=lanes, runner="threads",
                      num_workers=2, seed=0)


def _energon_loader(lanes: int, root: str):
    import zephon_energon as ze

    wc = ze.WorkerConfig(rank=0, world_size=1, num_workers=0)
    ds = ze.get_train_dataset(root, worker_config=wc, batch_size=1, shuffle_buffer_size=None,
                              max_samples_per_sequence=None, canonical_replicas=lanes)
    return ze.get_savable_loader(ds)


def _energon_dataset(loader):
    """The core dataset under a zephon_energon loader (to count its reads)."""
    from zephon.formats.base import Dataset

    seen, todo = set(), [loader]
    while todo:
        x = todo.pop()
        if id(x) in seen:
            continue
        seen.add(id(x))
        if isinstance(x, Dataset):
            return x
        for v in getattr(x, "__dict__", {}).values():
            todo += v if isinstance(v, (list, tuple)) else [v]
    raise RuntimeError("no zephon Dataset found under the zephon_energon loader")


def child(kind: str, lanes: int, restore: bool, paths: dict) -> dict:
    """One measurement: reads and seconds to the first micro-batch and to the first global batch."""
    if kind.startswith("text"):
        pack = kind == "text-pack"
        if restore:
            _, warm = _text_loader(lanes, paths["text"], paths["tok"], pack)
            it = iter(warm)
            for _ in range(3 * lanes):
                next(it)
            state = warm.checkpoint()
            warm.close()
        ds, loader = _text_loader(lanes, paths["text"], paths["tok"], pack)
        if restore:
            loader.restore(state)
        count = Counter(ds)
        t0 = time.perf_counter()
        it, first, consumed = iter(loader), None, 0
        for i in range(lanes):  # one row per lane: the global batch is `lanes` micro-batches
            mb = next(it)
            if pack:  # documents in the packed row: where position_ids restart
                consumed += int(((mb["position_ids"] == 0) & (mb["attention_mask"] == 1)).sum())
            else:  # one row per document
                consumed += len(mb["input_ids"])
            if first is None:
                first = (time.perf_counter() - t0, count.n)
        total = (time.perf_counter() - t0, count.n)
        loader.close()
    else:
        if restore:
            warm = _energon_loader(lanes, paths["vl"])
            it = iter(warm)
            for _ in range(3 * lanes):
                next(it)
            state = warm.save_state_rank()
        loader = _energon_loader(lanes, paths["vl"])
        if restore:
            loader.restore_state_rank(state)
        count = Counter(_energon_dataset(loader))
        t0 = time.perf_counter()
        it, first, consumed = iter(loader), None, 0
        for _ in range(lanes):  # batch_size 1: one sample per lane and step
            consumed += len(next(it).__key__)
            if first is None:
                first = (time.perf_counter() - t0, count.n)
        total = (time.perf_counter() - t0, count.n)
    return {"kind": kind, "lanes": lanes, "restore": restore, "first_s": first[0], "first_read": first[1],
            "step_s": total[0], "step_read": total[1], "consumed": consumed}


def run_all(root: str, workdir: Path, lanes=LANES, kinds=KINDS, vl_samples: int = 2048,
            timeout: float = 900) -> list[dict]:
    """Every (kind, lanes, cold/restore) in a child process on checkout ``root``; failed ones are reported.
    ``text-pack`` runs at 8 and 64 lanes only: its packer (32 open bins) needs ~700 documents per lane before a
    lane's first row, whatever the loader does, so 512 lanes cost ~360,000 documents before and after."""
    paths = {}
    if any(k.startswith("text") for k in kinds):
        paths["text"], paths["tok"] = _text_corpus(workdir)
    if "energon" in kinds:
        paths["vl"] = _vl_corpus(workdir, vl_samples)
    env = dict(os.environ, PYTHONPATH=f"{root}:{root}/adapters")
    out = []
    for kind in kinds:
        for n in [x for x in lanes if kind != "text-pack" or x <= 64]:
            for restore in (False, True):
                cfg = json.dumps({"kind": kind, "lanes": n, "restore": restore, "paths": paths})
                try:
                    p = subprocess.run([sys.executable, __file__, "--child", cfg], env=env, capture_output=True,
                                       text=True, timeout=timeout, cwd=root)
                    line = [x for x in p.stdout.splitlines() if x.startswith(TAG)]
                    r = json.loads(line[-1][len(TAG):]) if line else {"error": p.stderr.strip()[-300:]}
                except subprocess.TimeoutExpired:
                    r = {"error": f"no first batch within {timeout:.0f} s"}
                r.update(kind=kind, lanes=n, restore=restore)
                print(_row(r), f"(load {os.getloadavg()[0]:.1f})", flush=True)
                out.append(r)
    return out


def _row(r: dict) -> str:
    what = f"| {r['kind']} | {r['lanes']} | {'restore' if r['restore'] else 'cold'} |"
    if "error" in r:
        return f"{what} failed: {r['error']} |"
    ratio = r["step_read"] / max(1, r["consumed"])
    return (f"{what} {r['first_read']:,} | {r['step_read']:,} | {r['consumed']:,} | {ratio:.1f}x | "
            f"{r['first_s']:.2f} | {r['step_s']:.2f} |")


HEADER = ("| pipeline | lanes | start | read before 1st micro-batch | read before 1st global batch | consumed by it "
          "| read / consumed | s to 1st micro-batch | s to 1st global batch |\n|---|---|---|---|---|---|---|---|---|")


def main(argv=None) -> int:
    """Print the table for this checkout (or ``--root``). Returns the exit status."""
    ap = argparse.ArgumentParser(prog="python -m benchmarks.first_batch")
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--root", default=str(REPO), help="checkout whose zephon is measured (default: this one)")
    ap.add_argument("--workdir", default=None)
    ap.add_argument("--quick", action="store_true", help="8 and 64 lanes only")
    ap.add_argument("--kinds", default=",".join(KINDS))
    args = ap.parse_args(argv)
    if args.child:  # run as a script (``__file__``) with the measured checkout on PYTHONPATH
        cfg = json.loads(args.child)
        print(TAG + json.dumps(child(cfg["kind"], cfg["lanes"], cfg["restore"], cfg["paths"])), flush=True)
        return 0
    from zephon.demo_corpus import default_workdir

    workdir = Path(args.workdir or default_workdir())
    workdir.mkdir(parents=True, exist_ok=True)
    print(f"checkout {args.root}; load average {os.getloadavg()[0]:.1f}\n{HEADER}", flush=True)
    run_all(args.root, workdir, LANES[:2] if args.quick else LANES, tuple(args.kinds.split(",")))
    print(f"load average {os.getloadavg()[0]:.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
