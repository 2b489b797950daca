"""Waste at the end of a finite packed pass against the lane count: padding plus all-padding tail rows.

Corpus: ``DOCS`` short documents with lognormal lengths (median ~80 bytes, mean ~100, a long tail), made
deterministically from a seed; ``tokenizer="bytes"`` so a document's tokens are its UTF-8 bytes plus EOS.
One pass (``exhaustion="stop"``), ``Pack(2048)``, ``Batch(1)`` per lane (one row per lane per step). With
``drop_last=False``: ``waste %`` = padded tokens of every delivered row (padding rows included) / delivered
row tokens; with ``drop_last=True``: the rows dropped and the tokens they held. ``bound`` =
ceil(tokens / 2048), the fewest rows any packer can use; ``step bound``: that rounded up to whole steps (a
multiple of the lane count), the fewest rows any split can deliver without dropping. ``before``: the count split
(ALGORITHM_VERSION 2, reproduced by switching the size split off); ``after``: the size split (work/balance.py).

    python -m benchmarks --only pass-end [--quick]

Prints a table; asserts nothing.
"""
from __future__ import annotations

import contextlib
import itertools
import json
import math
import os
from pathlib import Path

MAX_LEN = 2048
DOCS = 54_000
LANES = (8, 16, 64)


def write_corpus(path: str, docs: int = DOCS, seed: int = 0) -> list[int]:
    """Write ``docs`` JSONL documents of lognormal lengths to ``path``; return their lengths in bytes.

    path: file to write (replaced). docs: how many. seed: numpy seed (the same seed, the same file)."""
    import numpy as np

    rng = np.random.default_rng(seed)
    lengths = np.clip(np.round(rng.lognormal(math.log(80), 0.65, docs)), 8, 4000).astype(int)
    letters = np.frombuffer(b"abcdefghijklmnopqrstuvwxyz     ", dtype=np.uint8)
    text = letters[rng.integers(0, letters.size, int(lengths.sum()))].tobytes().decode()
    tmp = path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as fh:
        at = 0
        for n in lengths.tolist():
            fh.write(json.dumps({"text": text[at:at + n]}) + "\n")
            at += n
    os.replace(tmp, path)
    return lengths.tolist()


def one_pass(path: str, lanes: int, drop_last: bool, split: str = "size") -> dict:
    """One finite packed pass at ``lanes`` lanes: rows (real and padding), real tokens, dropped rows/tokens.
    split: ``"size"`` (now) or ``"count"`` (before: ALGORITHM_VERSION 2, the size split switched off)."""
    from unittest import mock

    from zephon import Batch, Decode, Loader, Pack, Tokenize, open_dataset

    ops = [Decode(), Tokenize("bytes", eos_id="<eos>", max_length=MAX_LEN), Pack(MAX_LEN),
           Batch(1, drop_last=drop_last)]
    rows = pad_rows = tokens = 0
    # before: the size split switched off, which leaves the count split of ALGORITHM_VERSION 2 unchanged
    off = contextlib.nullcontext() if split == "size" else mock.patch("zephon.work.balance.balanced_bounds",
                                                                      lambda *a: None)
    with off, Loader([open_dataset(path)], ops, canonical_replicas=lanes, exhaustion="stop", runner="inline") as L:
        for mb in L:
            pad_rows += mb.get("__pad__", 0)
            rows += len(mb["input_ids"])
            tokens += int(mb["attention_mask"].sum())
        stats = L.stats()
    return {"rows": rows, "pad_rows": pad_rows, "tokens": tokens, "dropped_rows": stats.get("dropped_rows", 0)}


def run(workdir: str, quick: bool, log=print) -> list[dict]:
    """The table's rows: per lane count and drop_last, the pass's rows and waste."""
    root = Path(workdir) / "pass-end"
    root.mkdir(parents=True, exist_ok=True)
    docs = DOCS // 5 if quick else DOCS
    path = str(root / f"lognormal-{docs}.jsonl")
    lengths = write_corpus(path, docs)
    total = sum(lengths) + len(lengths)  # bytes + one EOS each
    bound = -(-total // MAX_LEN)
    out = []
    for lanes, drop_last, split in itertools.product(LANES, (False, True), ("count", "size")):
        r = one_pass(path, lanes, drop_last, split)
        row = {"lanes": lanes, "drop_last": drop_last, "split": "before (count)" if split == "count" else
               "after (size)", "documents": docs, "tokens": total, "bound": bound,
               "step bound": lanes * -(-bound // lanes), "rows": r["rows"], "padding rows": r["pad_rows"]}
        if drop_last:
            row["dropped rows"] = r["dropped_rows"]
            row["dropped tokens %"] = round(100 * (1 - r["tokens"] / total), 3)
        else:
            row["waste %"] = round(100 * (1 - r["tokens"] / (r["rows"] * MAX_LEN)), 3)
        log(row)
        out.append(row)
    return out


def table(rows: list[dict]) -> str:
    """Markdown table of ``run``'s rows."""
    cols = ["lanes", "drop_last", "split", "rows", "bound", "step bound", "padding rows",
            "waste %", "dropped rows", "dropped tokens %"]
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    lines += ["| " + " | ".join(str(r.get(c, "")) for c in cols) + " |" for r in rows]
    return "\n".join(lines)


def main(workdir: str, quick: bool) -> str:
    """Run and print the table; return it."""
    t = table(run(workdir, quick, log=lambda r: None))
    print(t)
    return t
