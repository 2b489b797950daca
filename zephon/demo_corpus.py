"""The embedded default corpus and tokenizer, built from real text already on the machine.

Two datasets from the running interpreter's standard library (Python Software Foundation License):
``stdlib-source`` (one document per top-level block of each ``.py`` file) and ``stdlib-docstrings``
(one document per module, class and function docstring, found with ``ast``). Written as JSONL and as
Parquet (same documents). The tokenizer is a byte-level BPE trained locally with ``tokenizers`` on
that corpus (no hub download). Everything is cached in ``workdir`` and reused when present.
"""
from __future__ import annotations

import ast
import json
import os
import sysconfig
from pathlib import Path

from .formats.fileio import atomic_write, atomic_writer

SPECIAL_TOKENS = ["<pad>", "<eos>", "<bos>", "<unk>"]


def _stdlib_files(limit_bytes: int) -> list[Path]:
    root = Path(sysconfig.get_paths()["stdlib"])
    files, total = [], 0
    for p in sorted(root.rglob("*.py")):
        rel = p.relative_to(root).parts
        if rel[0] in ("site-packages", "test", "idlelib", "lib2to3") or "tests" in rel:
            continue
        try:
            size = p.stat().st_size
        except OSError:
            continue
        files.append(p)
        total += size
        if total >= limit_bytes:
            break
    return files


def _documents(files: list[Path]):
    source, docstrings = [], []
    for p in files:
        try:
            text = p.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError):
            continue
        blocks = [b for b in text.split("\n\n\n") if b.strip()]  # top-level defs are separated by 2 blank lines
        source.extend({"text": b, "file": p.name} for b in blocks)
        try:
            tree = ast.parse(text)
        except SyntaxError:
            continue
        for node in ast.walk(tree):
            if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
                doc = ast.get_docstring(node)
                if doc and len(doc) > 20:
                    docstrings.append({"text": doc, "file": p.name})
    return source, docstrings


def build_corpus(workdir, limit_bytes: int = 12 << 20, shards: int = 4) -> dict:
    """Write the two datasets to ``workdir`` as JSONL (``shards`` files each) and Parquet.

    Returns ``{"source_jsonl": dir, "docstrings_jsonl": dir, "source_parquet": dir,
    "docstrings_parquet": dir}``. ``limit_bytes``: bytes of stdlib source read (about 1/3 become tokens)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    workdir = Path(workdir)
    out = {f"{name}_{fmt}": str(workdir / fmt / name)
           for name in ("source", "docstrings") for fmt in ("jsonl", "parquet")}
    stamp = workdir / "corpus.json"
    if stamp.exists() and json.loads(stamp.read_text()).get("limit_bytes") == limit_bytes:
        return out
    source, docstrings = _documents(_stdlib_files(limit_bytes))
    for name, docs in (("source", source), ("docstrings", docstrings)):
        for fmt in ("jsonl", "parquet"):
            Path(out[f"{name}_{fmt}"]).mkdir(parents=True, exist_ok=True)
        for k in range(shards):
            part = docs[k::shards]
            # atomic: a second process building the same corpus at once never exposes a half-written part
            lines = "".join(json.dumps(d) + "\n" for d in part)
            atomic_write(Path(out[f"{name}_jsonl"]) / f"part-{k:05d}.jsonl", lines)
            table = pa.table({"text": [d["text"] for d in part], "file": [d["file"] for d in part]})
            with atomic_writer(Path(out[f"{name}_parquet"]) / f"part-{k:05d}.parquet") as fh:
                pq.write_table(table, fh, row_group_size=1000)
    # the stamp says "complete": written last and atomically, so a crash mid-build means a rebuild
    atomic_write(stamp, json.dumps({"limit_bytes": limit_bytes, "source_docs": len(source),
                                    "docstring_docs": len(docstrings)}))
    return out


def build_tokenizer(workdir, corpus_dirs, vocab_size: int = 8192) -> str:
    """Train (once) a byte-level BPE on the JSONL files under ``corpus_dirs``; return the path of its
    ``tokenizer.json``. Special tokens: ``<pad>`` (0), ``<eos>`` (1), ``<bos>`` (2), ``<unk>`` (3)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    path = Path(workdir) / f"tokenizer-bpe{vocab_size}.json"
    if path.exists():
        return str(path)
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=SPECIAL_TOKENS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)

    def texts():
        for d in corpus_dirs:
            for f in sorted(Path(d).glob("*.jsonl")):
                with open(f, encoding="utf-8") as fh:
                    for line in fh:
                        yield json.loads(line)["text"]

    tok.train_from_iterator(texts(), trainer)
    atomic_write(path, tok.to_str(pretty=True))  # what tok.save(path) writes, never half of it
    return str(path)


def default_workdir() -> str:
    """``$ZEPHON_DEMO_DIR`` or ``~/.cache/zephon/demo``."""
    return os.environ.get("ZEPHON_DEMO_DIR") or os.path.join(os.path.expanduser("~"), ".cache", "zephon", "demo")
