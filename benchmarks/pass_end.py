"""Waste at the end of a finite packed pass against the lane count: padding plus all-padding tail rows.

Corpus: ``DOCS`` short documents with lognormal lengths (median ~80 bytes, mean ~100, a long tail), made
deterministically from a seed; ``tokenizer="bytes"`` so a document's tokens are its UTF-8 bytes plus EOS.
One pass (``exhaustion="stop"``), ``Pack(2048)``, ``Batch(1)`` per lane (one row per lane per step), with three
tails: ``pad`` (``drop_last=False``: the last step padded on every lane, the default), ``short``
(``Batch(drop_last=False, short_last=True)``: only real rows, the last step short) and ``drop``
(``drop_last=True``). ``waste %`` = padded tokens of every delivered row (padding rows included) / delivered
row tokens; with ``drop``: the rows dropped and the tokens they held. ``bound`` = ceil(tokens / 2048), the
fewest rows any packer can use; ``step bound``: that rounded up to whole steps (a multiple of the lane count),
the fewest rows a padded tail can deliver. ``split``: ``count`` (ALGORITHM_VERSION 2), ``size`` (3: equal bytes
per lane), ``whole rows`` (4: whole rows per lane; the short and dropped tails), earlier ones reproduced by
switching the later ones off (work/balance.py, engine/rowsplit.py).

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


#: (tail, split) runs per lane count. tail: "pad" (drop_last=False, the default), "short" (drop_last=False,
#: short_last=True), "drop" (drop_last=True). split: "count" (ALGORITHM_VERSION 2), "size" (3: equal bytes per
#: lane), "rows" (4: whole rows per lane, which the short and dropped tails use; the padded tail keeps "size").
RUNS = [("pad", "count"), ("pad", "size"), ("short", "rows"), ("drop", "count"), ("drop", "size"), ("drop", "rows")]
LABELS = {"count": "count (v2)", "size": "size (v3)", "rows": "whole rows (v4)"}


def one_pass(path: str, lanes: int, tail: str, split: str = "rows") -> dict:
    """One finite packed pass at ``lanes`` lanes: rows (real and padding), real tokens, dropped rows.
    tail: "pad", "short" or "drop" (``RUNS``); split: "count", "size" or "rows" (earlier splits reproduced by
    switching the later ones off)."""
    from unittest import mock

    from zephon import Batch, Decode, Loader, Pack, Tokenize, open_dataset

    batch = Batch(1, drop_last=tail == "drop", short_last=tail == "short")
    ops = [Decode(), Tokenize("bytes", eos_id="<eos>", max_length=MAX_LEN), Pack(MAX_LEN), batch]
    rows = pad_rows = tokens = 0
    off = contextlib.ExitStack()
    if split != "rows":  # v3: no whole-row plan
        off.enter_context(mock.patch("zephon.engine.plan.row_split", lambda *a: None))
    if split == "count":  # v2: the size split switched off too
        off.enter_context(mock.patch("zephon.work.balance.balanced_bounds", lambda *a: None))
    with off, Loader([open_dataset(path)], ops, canonical_replicas=lanes, exhaustion="stop", runner="inline") as L:
        for mb in L:
            pad_rows += mb.get("__pad__", 0)
            rows += len(mb["input_ids"])
            tokens += int(mb["attention_mask"].sum())
        stats = L.stats()
    return {"rows": rows, "pad_rows": pad_rows, "tokens": tokens, "dropped_rows": stats.get("dropped_rows", 0)}


def run(workdir: str, quick: bool, log=print) -> list[dict]:
    """The table's rows: per lane count, tail and split, the pass's rows and waste."""
    root = Path(workdir) / "pass-end"
    root.mkdir(parents=True, exist_ok=True)
    docs = DOCS // 5 if quick else DOCS
    path = str(root / f"lognormal-{docs}.jsonl")
    lengths = write_corpus(path, docs)
    total = sum(lengths) + len(lengths)  # bytes + one EOS each
    bound = -(-total // MAX_LEN)
    out = []
    for lanes, (tail, split) in itertools.product(LANES, RUNS):
        r = one_pass(path, lanes, tail, split)
        row = {"lanes": lanes, "tail": tail, "split": LABELS[split], "documents": docs, "tokens": total,
               "bound": bound, "step bound": lanes * -(-bound // lanes), "rows": r["rows"],
               "padding rows": r["pad_rows"]}
        if tail == "drop":
            row["dropped rows"] = r["dropped_rows"]
            row["dropped tokens %"] = round(100 * (1 - r["tokens"] / total), 3)
        else:
            row["waste %"] = round(100 * (1 - r["tokens"] / (r["rows"] * MAX_LEN)), 3)
        log(row)
        out.append(row)
    return out


def table(rows: list[dict]) -> str:
    """Markdown table of ``run``'s rows."""
    cols = ["lanes", "tail", "split", "rows", "bound", "step bound", "padding rows",
            "waste %", "dropped rows", "dropped tokens %"]
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    lines += ["| " + " | ".join(str(r.get(c, "")) for c in cols) + " |" for r in rows]
    return "\n".join(lines)


def main(workdir: str, quick: bool) -> str:
    """Run and print the table; return it."""
    t = table(run(workdir, quick, log=lambda r: None))
    print(t)
    return t
