"""Shared fixtures: a small real-text corpus (the interpreter's standard-library docstrings and
sources) as JSONL and Parquet, and a byte-level BPE trained on it with ``tokenizers``."""
from __future__ import annotations

import ast
import json
import sysconfig
from pathlib import Path

import pytest


def _stdlib_documents(max_files: int = 60):
    root = Path(sysconfig.get_paths()["stdlib"])
    docs, code = [], []
    for p in sorted(root.glob("*.py"))[:max_files]:
        text = p.read_text(encoding="utf-8", errors="replace")
        code.extend(b for b in text.split("\n\n\n") if b.strip())
        try:
            tree = ast.parse(text)
        except SyntaxError:
            continue
        for node in ast.walk(tree):
            if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef)):
                d = ast.get_docstring(node)
                if d:
                    docs.append(d)
    return docs, code


@pytest.fixture(scope="session")
def stdlib_texts():
    """(docstrings, code blocks): lists of real text documents."""
    return _stdlib_documents()


@pytest.fixture(scope="session")
def corpus(tmp_path_factory, stdlib_texts):
    """Two datasets written as JSONL (3 shards each) and as Parquet (same documents).
    Returns a dict of directories: docs_jsonl, code_jsonl, docs_parquet, code_parquet."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    root = tmp_path_factory.mktemp("corpus")
    out = {}
    docs, code = stdlib_texts
    for name, texts in (("docs", docs[:900]), ("code", code[:600])):
        jd, pd_ = root / f"{name}_jsonl", root / f"{name}_parquet"
        jd.mkdir()
        pd_.mkdir()
        for k in range(3):
            part = texts[k::3]
            with open(jd / f"part-{k}.jsonl", "w", encoding="utf-8") as fh:
                for i, t in enumerate(part):
                    fh.write(json.dumps({"text": t, "id": f"{name}-{k}-{i}"}) + "\n")
            pq.write_table(pa.table({"text": part, "id": [f"{name}-{k}-{i}" for i in range(len(part))]}),
                           pd_ / f"part-{k}.parquet", row_group_size=64)
        out[f"{name}_jsonl"], out[f"{name}_parquet"] = str(jd), str(pd_)
    return out


@pytest.fixture(scope="session")
def tokenizer_path(tmp_path_factory, stdlib_texts):
    """A 1,000-token byte-level BPE trained locally; ``<pad>`` = 0, ``<eos>`` = 1."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    trainer = trainers.BpeTrainer(vocab_size=1000, special_tokens=["<pad>", "<eos>", "<unk>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    docs, code = stdlib_texts
    tok.train_from_iterator(docs + code, trainer)
    path = tmp_path_factory.mktemp("tok") / "tokenizer.json"
    tok.save(str(path))
    return str(path)


@pytest.fixture(scope="session")
def s3_server():
    """moto's S3 server on 127.0.0.1 (a free port) for the remote tests (tests/s3_server.py); stopped at the end."""
    from s3_server import S3Server
    srv = S3Server.start()
    yield srv
    srv.stop()


@pytest.fixture
def s3(s3_server, monkeypatch, tmp_path):
    """A reset ``s3_server`` with bucket ``s3_server.BUCKET``, this process's endpoint (``S3_ENDPOINT_URL``) and
    test credentials in the environment, and ``ZEPHON_CACHE_DIR`` under ``tmp_path``."""
    from s3_server import BUCKET, CREDENTIALS
    s3_server.reset()
    for k, v in CREDENTIALS.items():
        monkeypatch.setenv(k, v)
    for k in ("AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3", "AWS_PROFILE", "AWS_SESSION_TOKEN"):
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setenv("S3_ENDPOINT_URL", s3_server.endpoint)
    monkeypatch.setenv("ZEPHON_CACHE_DIR", str(tmp_path / "zephon-cache"))
    s3_server.client().create_bucket(Bucket=BUCKET)
    return s3_server
