"""The embedded default corpus and tokenizer, built from real text already on the machine.

Two datasets from the running interpreter's standard library (Python Software Foundation License):
``stdlib-source`` (one document per top-level block of each ``.py`` file) and ``stdlib-docstrings``
(one document per module, class and function docstring, found with ``ast``). Written as JSONL and as
Parquet (same documents). The tokenizer is a byte-level BPE trained locally with ``tokenizers`` on
that corpus (no hub download). Everything is cached in ``workdir`` (``default_workdir``) and reused when present;
concurrent builders take turns under a file lock and publish whole folders atomically.
"""
from __future__ import annotations

import ast
import json
import os
import shutil
import sys
import sysconfig
import tempfile
import time
from contextlib import contextmanager
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


LOCK_NAME = ".build.lock"
LOCK_TIMEOUT_S = 1800.0  # a build takes a minute or two; a holder this slow is stuck


@contextmanager
def build_lock(workdir: Path, timeout: float = LOCK_TIMEOUT_S):
    """Hold an exclusive ``fcntl.flock`` on ``workdir/.build.lock`` (created with ``workdir``), so one process at a
    time builds or replaces the demo files; the kernel releases it if the holder dies.

    workdir: the demo folder. timeout: seconds to wait for another holder (then ``TimeoutError`` naming the lock).
    """
    import fcntl

    workdir.mkdir(parents=True, exist_ok=True)
    path = workdir / LOCK_NAME
    with open(path, "a+b") as fh:
        deadline, said = time.monotonic() + timeout, False
        while True:
            try:
                fcntl.flock(fh.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise TimeoutError(f"waited {timeout:.0f} s for another process building the demo corpus in "
                                       f"{workdir} (lock {path}); if none is running, delete the lock file") from None
                if not said:
                    print(f"waiting for another process building the demo corpus in {workdir} ...", file=sys.stderr)
                    said = True
                time.sleep(0.2)
        try:
            yield
        finally:
            fcntl.flock(fh.fileno(), fcntl.LOCK_UN)


def _built(stamp: Path, limit_bytes: int) -> bool:
    try:
        return json.loads(stamp.read_text()).get("limit_bytes") == limit_bytes
    except (OSError, ValueError):
        return False


def build_corpus(workdir, limit_bytes: int = 12 << 20, shards: int = 4) -> dict:
    """Write the two datasets to ``workdir`` as JSONL (``shards`` files each) and Parquet, once.

    Returns ``{"source_jsonl": dir, "docstrings_jsonl": dir, "source_parquet": dir,
    "docstrings_parquet": dir}``. ``limit_bytes``: bytes of stdlib source read (about 1/3 become tokens).
    Several processes may call it at once: the first builds under ``build_lock`` in a temporary folder and
    publishes it with ``os.replace``; the others wait, then reuse it (files once published never change, so a
    process reading them is never surprised). Raises ``TimeoutError`` when another builder holds the lock too long.
    """
    workdir = Path(workdir)
    out = {f"{name}_{fmt}": str(workdir / fmt / name)
           for name in ("source", "docstrings") for fmt in ("jsonl", "parquet")}
    stamp = workdir / "corpus.json"
    if _built(stamp, limit_bytes):
        return out
    with build_lock(workdir):
        if _built(stamp, limit_bytes):  # another process built it while this one waited
            return out
        tmp = Path(tempfile.mkdtemp(prefix=".build-", dir=workdir))
        try:
            counts = _write_corpus(tmp, limit_bytes, shards)
            stamp.unlink(missing_ok=True)  # from here until the new stamp the folder is incomplete
            for fmt in ("jsonl", "parquet"):
                if (workdir / fmt).exists():  # an older build (another limit_bytes): out of the way first
                    os.replace(workdir / fmt, tmp / f"old-{fmt}")
                os.replace(tmp / fmt, workdir / fmt)
            # the stamp says "complete": written last and atomically, so a crash mid-build means a rebuild
            atomic_write(stamp, json.dumps({"limit_bytes": limit_bytes, **counts}))
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return out


def _write_corpus(root: Path, limit_bytes: int, shards: int) -> dict:
    """Write ``root/{jsonl,parquet}/{source,docstrings}/part-NNNNN.*``; returns the document counts."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    source, docstrings = _documents(_stdlib_files(limit_bytes))
    for name, docs in (("source", source), ("docstrings", docstrings)):
        for fmt in ("jsonl", "parquet"):
            (root / fmt / name).mkdir(parents=True)
        for k in range(shards):
            part = docs[k::shards]
            lines = "".join(json.dumps(d) + "\n" for d in part)
            atomic_write(root / "jsonl" / name / f"part-{k:05d}.jsonl", lines)
            table = pa.table({"text": [d["text"] for d in part], "file": [d["file"] for d in part]})
            with atomic_writer(root / "parquet" / name / f"part-{k:05d}.parquet") as fh:
                pq.write_table(table, fh, row_group_size=1000)
    return {"source_docs": len(source), "docstring_docs": len(docstrings)}


def build_tokenizer(workdir, corpus_dirs, vocab_size: int = 8192) -> str:
    """Train (once, under ``build_lock``) a byte-level BPE on the JSONL files under ``corpus_dirs``; return the path of
    its ``tokenizer.json``. Special tokens: ``<pad>`` (0), ``<eos>`` (1), ``<bos>`` (2), ``<unk>`` (3)."""
    path = Path(workdir) / f"tokenizer-bpe{vocab_size}.json"
    if path.exists():
        return str(path)
    with build_lock(Path(workdir)):  # one process trains it; the others wait and reuse it
        if not path.exists():
            _train_tokenizer(path, corpus_dirs, vocab_size)
    return str(path)


def _train_tokenizer(path: Path, corpus_dirs, vocab_size: int) -> None:
    """Train the byte-level BPE of ``build_tokenizer`` and write it to ``path`` atomically."""
    def texts():
        for d in corpus_dirs:
            for f in sorted(Path(d).glob("*.jsonl")):
                with open(f, encoding="utf-8") as fh:
                    for line in fh:
                        yield json.loads(line)["text"]

    train_byte_level_bpe(path, texts(), vocab_size)


def train_byte_level_bpe(path, texts, vocab_size: int, split_pattern: str | None = None) -> None:
    """Train a byte-level BPE (special tokens ``SPECIAL_TOKENS`` first, the 256 byte symbols) on ``texts`` and
    write its ``tokenizer.json`` to ``path`` atomically.

    path: the file to write. texts: an iterable of str. vocab_size: the target vocabulary (training stops short of
    it when the texts have no more merges). split_pattern: a regex that splits text before the byte-level mapping
    (Llama-3's ``Split`` + ``ByteLevel(use_regex=False)``); None: GPT-2's split built into ``ByteLevel``.
    """
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    if split_pattern is None:
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    else:
        tok.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(split_pattern), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=SPECIAL_TOKENS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(texts, trainer)
    atomic_write(path, tok.to_str(pretty=True))  # what tok.save(path) writes, never half of it


def default_workdir() -> str:
    """``$ZEPHON_DEMO_DIR``, else ``demo`` under ``$ZEPHON_CACHE_DIR``, else ``~/.cache/zephon/demo``."""
    cache = os.environ.get("ZEPHON_CACHE_DIR") or os.path.join(os.path.expanduser("~"), ".cache", "zephon")
    return os.environ.get("ZEPHON_DEMO_DIR") or os.path.join(cache, "demo")
