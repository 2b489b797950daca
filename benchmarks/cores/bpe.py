"""A 131,072-token byte-level BPE trained here, on text every machine with the venv has; cached, never committed.

    python -m benchmarks.cores.bpe [--cache DIR] [--vocab-size 131072] [--force]

A real model's tokenizer cannot be downloaded here, and the demo corpus (15 MB) runs out of merges at 64,325
tokens. This trains on a larger local corpus, concatenated in a fixed order: the demo corpus' JSONL texts, then
every ``.py``/``.md``/``.txt``/``.rst`` file of the Python standard library and of the venv's site-packages, paths
sorted, files over ``MAX_FILE_BYTES`` skipped (data dumps, not text), bytes decoded as UTF-8 with replacement.
Pre-tokenizer: Llama-3's split regex, then the byte-level mapping (as Llama-3's tokenizer.json does). The result
goes to ``$ZEPHON_CACHE_DIR`` (default ``~/.cache/zephon``) ``/bpe/tokenizer-bpe131072.json`` with a manifest
(file count, bytes, a SHA-256 of the file list and of the tokenizer): the same venv rebuilds the same file.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
import sysconfig
import time
from pathlib import Path

VOCAB = 131072
MAX_FILE_BYTES = 4 << 20
SUFFIXES = (".py", ".md", ".txt", ".rst")
# Llama-3's pre-tokenizer split (its tokenizer.json): contractions, letters, 1-3 digits, punctuation, spaces
LLAMA3_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                r"|\s*[\r\n]+|\s+(?!\S)|\s+")


def cache_dir() -> Path:
    """``$ZEPHON_CACHE_DIR/bpe``, default ``~/.cache/zephon/bpe``."""
    return Path(os.environ.get("ZEPHON_CACHE_DIR") or Path.home() / ".cache" / "zephon") / "bpe"


def default_roots() -> list[Path]:
    """The standard library and the running interpreter's site-packages (the venv's)."""
    paths = sysconfig.get_paths()
    return list(dict.fromkeys(Path(paths[k]).resolve() for k in ("stdlib", "purelib", "platlib")))


def corpus_files(roots, max_file_bytes: int = MAX_FILE_BYTES) -> list[Path]:
    """The text files under ``roots`` (suffixes ``SUFFIXES``, at most ``max_file_bytes``), in sorted order.

    roots: directories; a file reachable from two roots (site-packages inside the stdlib tree) is listed once.
    """
    seen, files = set(), []
    for root in roots:
        for dirpath, dirnames, names in os.walk(root):
            dirnames.sort()
            for n in sorted(names):
                p = Path(dirpath) / n
                if p.suffix not in SUFFIXES or p in seen:
                    continue
                try:
                    if not p.is_file() or p.stat().st_size > max_file_bytes:
                        continue
                except OSError:
                    continue
                seen.add(p)
                files.append(p)
    return files


def _texts(demo_dirs, files, stats):
    """The training texts: the demo corpus' documents, then each file's text in pieces of about 64 KiB."""
    for d in demo_dirs:
        for f in sorted(Path(d).glob("*.jsonl")):
            with open(f, encoding="utf-8") as fh:
                for line in fh:
                    text = json.loads(line)["text"]
                    stats["bytes"] += len(text.encode("utf-8"))
                    yield text
    for p in files:
        try:
            data = p.read_bytes()
        except OSError:
            continue
        stats["bytes"] += len(data)
        text = data.decode("utf-8", errors="replace")
        for i in range(0, len(text), 1 << 16):  # pieces keep the trainer's batches small; splits land mid-word rarely
            yield text[i:i + (1 << 16)]


def build(out: Path | None = None, vocab_size: int = VOCAB, *, roots=None, demo_dirs=None,
          force: bool = False, log=print) -> Path:
    """Train (once) the BPE and return its ``tokenizer.json`` path; a manifest ``.manifest.json`` sits beside it.

    out: the tokenizer file (default ``cache_dir() / f"tokenizer-bpe{vocab_size}.json"``). vocab_size: target
    vocabulary. roots: directories of text (default ``default_roots()``). demo_dirs: JSONL folders read first
    (default the demo corpus', built if missing). force: retrain even if the file exists.
    Raises RuntimeError if the corpus has too few merges to reach ``vocab_size``.
    """
    from zephon.demo_corpus import build_corpus, default_workdir, train_byte_level_bpe

    out = Path(out) if out else cache_dir() / f"tokenizer-bpe{vocab_size}.json"
    if out.exists() and not force:
        return out
    if demo_dirs is None:
        d = build_corpus(default_workdir())
        demo_dirs = [d["source_jsonl"], d["docstrings_jsonl"]]
    files = corpus_files(roots if roots is not None else default_roots())
    listing = hashlib.sha256("\n".join(map(str, files)).encode()).hexdigest()
    stats = {"bytes": 0}
    log(f"training a {vocab_size}-token BPE on {len(files)} files under {roots or default_roots()} ...")
    t0, c0 = time.perf_counter(), time.process_time()
    out.parent.mkdir(parents=True, exist_ok=True)
    train_byte_level_bpe(out, _texts(demo_dirs, files, stats), vocab_size, split_pattern=LLAMA3_SPLIT)
    from tokenizers import Tokenizer

    got = Tokenizer.from_file(str(out)).get_vocab_size()
    manifest = {"vocab_size": got, "target": vocab_size, "files": len(files), "bytes": stats["bytes"],
                "file_list_sha256": listing, "tokenizer_sha256": hashlib.sha256(out.read_bytes()).hexdigest(),
                "roots": [str(r) for r in (roots or default_roots())], "demo_dirs": [str(d) for d in demo_dirs],
                "train_s": round(time.perf_counter() - t0, 1), "train_cpu_s": round(time.process_time() - c0, 1)}
    out.with_suffix(".manifest.json").write_text(json.dumps(manifest, indent=1))
    log(f"  {got} tokens from {stats['bytes'] / 1e6:.0f} MB in {manifest['train_s']} s -> {out}")
    if got < vocab_size:
        out.rename(out.with_suffix(".short.json"))  # never served as the full vocabulary
        raise RuntimeError(f"the corpus under {manifest['roots']} ran out of merges at {got} tokens "
                           f"(target {vocab_size}); add text roots")
    return out


def manifest(path) -> dict:
    """The manifest ``build`` wrote beside ``path`` (``{}`` if none)."""
    p = Path(path).with_suffix(".manifest.json")
    return json.loads(p.read_text()) if p.exists() else {}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.cores.bpe", description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=None, help="tokenizer file (default: under ~/.cache/zephon/bpe)")
    ap.add_argument("--vocab-size", type=int, default=VOCAB)
    ap.add_argument("--force", action="store_true", help="retrain even if the file exists")
    args = ap.parse_args(argv)
    path = build(args.out, args.vocab_size, force=args.force)
    print(json.dumps({"path": str(path), **manifest(path)}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
