"""Data of the loss-curve experiment, built once and cached: the demo corpus split into training and
held-out documents, a small byte-level BPE, the held-out rows, and (on first use) the training documents
in the peers' own formats (pre-tokenized, pre-packed Mosaic MDS rows; an ``energon prepare``d WebDataset).

Everything lands under ``<workdir>/loss-curves/`` (``workdir``: the demo's, ``zephon.demo_corpus``)
and is reused when its manifest matches. See docs/loss-curves.md.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np

VERSION = 1
TRAIN_PARTS = ("part-00000", "part-00001", "part-00002")  # of each demo dataset; part-00003 is held out
HELDOUT_PART = "part-00003"


def _jsonl_texts(files: list[str]) -> list[str]:
    out = []
    for f in files:
        with open(f, encoding="utf-8") as fh:
            out.extend(json.loads(line)["text"] for line in fh if line.strip())
    return out


def encode_docs(tok, texts: list[str], eos: int) -> list[np.ndarray]:
    """Token ids of each text with an EOS appended (what every loader here trains on).

    Args:
        tok: a ``tokenizers.Tokenizer``.
        texts: documents.
        eos: id appended to each document.
    Returns one int64 array per document."""
    enc = tok.encode_batch(texts, add_special_tokens=False)
    return [np.asarray(e.ids + [eos], dtype=np.int64) for e in enc]


def concat_rows(docs: list[np.ndarray], seq_len: int) -> tuple[np.ndarray, np.ndarray]:
    """Concatenate-and-split with the shift inside each document (TorchTitan's text packing).

    Args:
        docs: token ids per document (EOS included).
        seq_len: tokens per row.
    Returns ``(inputs, targets)``, int64 ``[rows, seq_len]`` each; the tail shorter than a row is dropped."""
    inp = np.concatenate([d[:-1] for d in docs])
    tgt = np.concatenate([d[1:] for d in docs])
    n = len(inp) // seq_len
    return inp[:n * seq_len].reshape(n, seq_len), tgt[:n * seq_len].reshape(n, seq_len)


def prepare(workdir: str, vocab: int, seq_len: int, heldout_rows: int, log=print) -> dict:
    """Build (or reuse) the experiment's data; returns its manifest.

    Args:
        workdir: the demo workdir (corpus and tokenizers are cached there).
        vocab: BPE vocabulary size (a small one keeps the output layer cheap on CPU).
        seq_len: tokens per training row (model input length).
        heldout_rows: rows of ``seq_len`` tokens in the held-out set.
    Manifest keys: ``root``, ``tokenizer`` (path), ``eos``, ``seq_len``, ``train_files`` /
    ``heldout_files`` (JSONL paths), ``train_docs``, ``heldout`` (``.npz`` of inputs/targets). The peers'
    formats are built on first use: ``mds_rows(m)``, ``energon_wds(m)``."""
    from tokenizers import Tokenizer

    from zephon.demo_corpus import build_corpus, build_tokenizer

    dirs = build_corpus(workdir)
    tok_path = build_tokenizer(workdir, [dirs["source_jsonl"], dirs["docstrings_jsonl"]], vocab_size=vocab)
    train = [os.path.join(dirs[f"{n}_jsonl"], f"{p}.jsonl") for n in ("source", "docstrings") for p in TRAIN_PARTS]
    held = [os.path.join(dirs[f"{n}_jsonl"], f"{HELDOUT_PART}.jsonl") for n in ("source", "docstrings")]
    root = Path(workdir) / "loss-curves" / f"v{VERSION}-bpe{vocab}-L{seq_len}-H{heldout_rows}"
    mpath = root / "manifest.json"
    if mpath.exists():
        m = json.loads(mpath.read_text())
        if os.path.exists(m["heldout"]):
            return m
    shutil.rmtree(root, ignore_errors=True)
    root.mkdir(parents=True)
    tok = Tokenizer.from_file(tok_path)
    eos = tok.token_to_id("<eos>")
    texts = _jsonl_texts(train)
    m = {"version": VERSION, "root": str(root), "tokenizer": tok_path, "eos": eos, "vocab": vocab,
         "seq_len": seq_len, "train_files": train, "heldout_files": held, "train_docs": len(texts)}

    # Held-out: the two held-out shards' documents interleaved (both kinds of text), packed once.
    hs = [_jsonl_texts([f]) for f in held]
    mixed = [t for pair in zip(*hs) for t in pair]
    hi, ht = concat_rows(encode_docs(tok, mixed, eos), seq_len)
    idx = np.linspace(0, len(hi) - 1, heldout_rows).astype(int)  # spread over the whole held-out text
    np.savez(root / "heldout.npz", inputs=hi[idx], targets=ht[idx])
    m["heldout"] = str(root / "heldout.npz")

    mpath.write_text(json.dumps(m, indent=1))
    log(f"prepared {len(texts)} training documents and {heldout_rows} held-out rows under {root}")
    return m


def heldout(m: dict):
    """The held-out rows as torch tensors ``(inputs, targets)``, int64 ``[heldout_rows, seq_len]``."""
    import torch

    z = np.load(m["heldout"])
    return torch.from_numpy(z["inputs"]), torch.from_numpy(z["targets"])


def mds_rows(m: dict) -> str:
    """Mosaic MDS of the training text as rows of ``seq_len + 1`` tokens (built once); returns its directory.

    Mosaic users pretrain on MDS written offline, tokenized and concatenated (LLM Foundry's
    ``convert_dataset_hf --concat_tokens``): documents in corpus order, EOS-separated, cut into rows."""
    from streaming import MDSWriter
    from tokenizers import Tokenizer

    out = Path(m["root"]) / "mds"
    if (out / "index.json").exists():
        return str(out)
    tmp = Path(m["root"]) / "mds.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    L = m["seq_len"] + 1
    flat = np.concatenate(encode_docs(Tokenizer.from_file(m["tokenizer"]), _jsonl_texts(m["train_files"]), m["eos"]))
    rows = flat[:len(flat) // L * L].reshape(-1, L).astype(np.int16)
    with MDSWriter(out=str(tmp), columns={"tokens": "bytes"}, size_limit=1 << 20) as w:
        for r in rows:
            w.write({"tokens": r.tobytes()})
    os.replace(tmp, out)  # complete or absent: a crash mid-write means a rebuild
    return str(out)


def energon_wds(m: dict) -> str:
    """The training documents as a WebDataset prepared by ``energon prepare`` (built once); returns its path."""
    import webdataset as wds

    out = Path(m["root"]) / "wds"
    if (out / ".nv-meta" / "split.yaml").exists():
        return str(out)
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir()
    texts = _jsonl_texts(m["train_files"])
    with wds.ShardWriter(str(out / "docs-%04d.tar"), maxcount=max(64, len(texts) // 16), verbose=0) as w:
        for i, t in enumerate(texts):
            w.write({"__key__": f"doc{i:06d}", "txt": t})
    exe = os.path.join(os.path.dirname(sys.executable), "energon")
    subprocess.run([exe, "prepare", "--non-interactive", "--no-progress", "--num-workers", "1",
                    "--sample-type", "TextSample", "--field-map", json.dumps({"text": "txt"}),
                    "--split-parts", "train:.*", str(out)], check=True, stdout=subprocess.DEVNULL,
                   stderr=subprocess.PIPE)
    return str(out)
