"""benchmarks/cores/ (``python -m benchmarks --only cores``): the local BPE builder and the tokens-per-CPU-second
table, at a tiny vocabulary and the demo corpus' first shards (seconds)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("tokenizers")


def _tiny_roots(tmp_path: Path) -> Path:
    root = tmp_path / "texts"
    (root / "b").mkdir(parents=True)
    (root / "a.py").write_text("def alpha(beta, gamma):\n    return beta + gamma * 3\n" * 40)
    (root / "b" / "notes.md").write_text("# Heading\nSome prose about tokenizers, merges and words.\n" * 40)
    (root / "b" / "skip.bin").write_bytes(b"\x00\x01 not text" * 40)  # not a text suffix: not read
    return root


def test_bpe_build_is_deterministic_and_reaches_its_vocabulary(tmp_path):
    from tokenizers import Tokenizer

    from benchmarks.cores.bpe import build, corpus_files, manifest

    root = _tiny_roots(tmp_path)
    assert [p.name for p in corpus_files([root])] == ["a.py", "notes.md"]  # sorted, suffixes only
    a = build(tmp_path / "one.json", 300, roots=[root], demo_dirs=[], log=lambda *_: None)
    b = build(tmp_path / "two.json", 300, roots=[root], demo_dirs=[], log=lambda *_: None)
    assert a.read_bytes() == b.read_bytes()
    assert Tokenizer.from_file(str(a)).get_vocab_size() == 300
    size = sum(len(p.read_bytes()) for p in corpus_files([root]))
    assert manifest(a)["bytes"] == size and manifest(a)["files"] == 2
    with pytest.raises(RuntimeError, match="ran out of merges"):  # this little text cannot give 131,072 tokens
        build(tmp_path / "big.json", 131072, roots=[root], demo_dirs=[], log=lambda *_: None)
    assert not (tmp_path / "big.json").exists()


def test_cores_table_counts_every_token_of_the_pass(tmp_path, capsys):
    from tokenizers import Tokenizer

    from benchmarks.cores.bpe import build
    from benchmarks.cores.measure import GPU_RATES, main
    from zephon.demo_corpus import build_corpus, default_workdir

    dirs = build_corpus(default_workdir())
    tok = build(tmp_path / "tok.json", 400, roots=[_tiny_roots(tmp_path)],
                demo_dirs=[dirs["source_jsonl"], dirs["docstrings_jsonl"]], log=lambda *_: None)
    configs = ["raw", "threads:2", "processes:1"]
    assert main(["--quick", "--lanes", "4", "--repeats", "1", "--configs", ",".join(configs),
                 "--tokenizer", str(tok)]) == 0
    out = capsys.readouterr().out
    rows = [line for line in out.splitlines() if line.startswith("| ")][1:]
    assert [r.split(" | ")[0][2:] for r in rows] == configs
    assert not [r for r in rows if "failed" in r], rows
    # every document of the first shards once, with its <eos>: counted here, with the tokenizer alone
    t = Tokenizer.from_file(str(tok))
    expected = 0
    for d in ("source_jsonl", "docstrings_jsonl"):
        with open(sorted(Path(dirs[d]).glob("part-*.jsonl"))[0], encoding="utf-8") as fh:
            expected += sum(len(t.encode(json.loads(line)["text"]).ids) + 1 for line in fh)
    runs = [line for line in out.splitlines() if line.strip().startswith("round ")]
    assert [int(r.split(": ")[1].split(" tokens")[0]) for r in runs] == [expected] * len(configs), runs
    for r in rows:  # cores per GPU grow with the GPU's rate, in proportion
        cores = [float(x) for x in r.split(" | ")[5:5 + len(GPU_RATES)]]
        assert cores == sorted(cores) and cores[-1] > 0
