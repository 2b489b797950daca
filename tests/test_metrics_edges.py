"""``Loader.metrics()`` under awkward use, each count checked against one made here from the input: read from another
thread while the inline runner works inside ``next()``, rows of tokens without ``Pack``, what ``zephon verify`` writes
and prints, the demo numbers docs/metrics.md quotes; and the warning for a splitting ``Tokenize`` before concat
packing. See docs/metrics.md."""
import json
import threading
import time
import warnings

import numpy as np
import pytest

from zephon import Batch, Decode, Loader, Map, Pack, Tokenize, open_dataset

SLOW_S = 0.05  # seconds per document of the slow map: a unit of 8 documents takes 0.4 s inside next()


def slow(record):
    """Sleep, then pass the record on (module-level: a Map function)."""
    time.sleep(SLOW_S)
    return record


def test_metrics_from_another_thread_do_not_wait_for_inline_work(tmp_path):
    (tmp_path / "a.jsonl").write_text("".join(json.dumps({"text": f"doc {i} " * 9}) + "\n" for i in range(24)))
    ops = [Decode(), Map(slow), Tokenize("bytes", eos_id=2), Pack(64, method="concat"), Batch(1)]
    loader = Loader([open_dataset(str(tmp_path))], ops, canonical_replicas=1, global_batch_size=1, chunk_size=8,
                    exhaustion="stop", runner="inline")
    it = iter(loader)
    first = next(it)
    rows_before = loader.metrics()["rows"]
    lat, started, stop = [], threading.Event(), threading.Event()

    def reader():
        started.wait()
        while not stop.is_set():
            t = time.perf_counter()
            m = loader.metrics()
            lat.append((time.perf_counter() - t, m["rows"]))
            time.sleep(0.02)

    th = threading.Thread(target=reader)
    th.start()
    t0 = time.perf_counter()
    started.set()
    taken = 0
    while time.perf_counter() - t0 < 1.0:  # rows of later units: next() works (SLOW_S x 8 per unit) holding the lock
        next(it)
        taken += 1
    stop.set()
    th.join()
    loader.close()
    assert first["input_ids"].shape == (1, 64) and rows_before == 1
    assert len(lat) >= 10, f"only {len(lat)} reads in 1 s: metrics() waited for next()'s work ({lat})"
    assert max(s for s, _ in lat) < 0.3, f"a metrics() read waited {max(s for s, _ in lat):.2f}s"
    # what the reads said is what was delivered: never more than the rows taken so far
    assert all(1 <= rows <= 1 + taken for _, rows in lat) and loader.metrics()["rows"] == 1 + taken


def test_verify_writes_the_metrics_it_prints(tmp_path, capsys):
    from zephon.cli import main

    for name, n in (("web", 30), ("code", 12)):
        (tmp_path / name).mkdir()
        (tmp_path / name / "a.jsonl").write_text("".join(json.dumps({"text": f"{name} {i} " * (i % 7 + 1)}) + "\n"
                                                         for i in range(n)))
    out_json = tmp_path / "report.json"
    steps, lanes, micro, L = 6, 4, 2, 16
    rc = main(["verify", "--data", str(tmp_path / "web"), "--data", str(tmp_path / "code"), "--weights", "5,2",
               "--tokenizer", "bytes", "--eos-token", "2", "--canonical-replicas", str(lanes), "--dp", "2",
               "--resume-dp", "4", "--checkpoint-step", "3", "--steps", str(steps), "--max-length", str(L),
               "--micro-batch", str(micro), "--pack-method", "concat", "--no-progress", "--output-json", str(out_json)])
    out = capsys.readouterr().out
    assert rc == 0, out
    m = json.loads(out_json.read_text())["metrics"]
    rows = steps * lanes * micro  # the reference run's global steps; concat rows of an endless stream are full
    assert (m["rows"], m["tokens"], m["padding_tokens"]) == (rows, rows * L, 0)
    assert sum(d["tokens"] for d in m["datasets"].values()) == rows * L
    assert f"metrics: {rows:,} rows, {rows * L:,} tokens" in out
    for name, d in m["datasets"].items():
        assert f"{name} {d['samples']:,} samples / {d['tokens']:,} tokens" in out


def test_rows_of_tokens_without_pack_count_their_tokens(tmp_path):
    texts = [f"document {i} " + "x" * (i % 11) for i in range(27)]
    (tmp_path / "a.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    want = sum(len(t.encode()) + 1 for t in texts)  # the byte tokenizer: a token per byte, plus the EOS
    for split in (None, 5):  # whole documents, and documents cut into pieces of at most 5 tokens
        ops = [Decode(), Tokenize("bytes", eos_id=2, max_length=split), Batch(2, drop_last=False)]
        loader = Loader([open_dataset(str(tmp_path), name="web")], ops, canonical_replicas=2, global_batch_size=4,
                        chunk_size=4, exhaustion="stop")
        seen = 0
        for mb in loader:  # rows at their own lengths: a list of token arrays, no mask
            seen += sum(len(ids) for ids in mb["input_ids"][:len(mb["input_ids"]) - mb.get("__pad__", 0)])
        m = loader.metrics()
        assert seen == want
        assert m["tokens"] == m["datasets"]["web"]["tokens"] == want, (split, m["tokens"])
        assert (m["padding_tokens"], m["padding_fraction"], m["datasets"]["web"]["samples"]) == (0, 0.0, len(texts))


def test_concat_after_a_splitting_tokenize_warns_that_pieces_become_documents(tmp_path):
    """Tokenize(max_length=...) then Pack(method="concat") (the README's best-fit pipeline with the method changed):
    concat packs each piece as a document. Checked on the rows (positions restart inside a document), then the
    warning at construction; Tokenize without max_length gives the rows of the whole documents and no warning."""
    text = "abcdefghijklmnopqrstuvwxyz"  # one document of 27 tokens (26 bytes and the EOS)
    (tmp_path / "a.jsonl").write_text(json.dumps({"text": text}) + "\n")

    def rows(split):
        ops = [Decode(), Tokenize("bytes", eos_id=2, max_length=split), Pack(32, method="concat"),
               Batch(1, drop_last=False)]
        loader = Loader([open_dataset(str(tmp_path))], ops, canonical_replicas=1, global_batch_size=1,
                        exhaustion="stop")
        return [mb for mb in loader]

    with pytest.warns(UserWarning, match=r"Tokenize\(max_length=10\) before Pack\(method='concat'\)"):
        split = rows(10)
    assert split[0]["position_ids"][0, :27].tolist() == [*range(10), *range(10), *range(7)]  # what it warns of
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        whole = rows(None)
    assert whole[0]["position_ids"][0, :27].tolist() == list(range(27))
    np.testing.assert_array_equal(whole[0]["input_ids"][0, :27], [b + 3 for b in text.encode()] + [2])


@pytest.mark.slow  # ~15 s per packer on 2 cores: one pass of the demo corpus; docs/metrics.md quotes its numbers
@pytest.mark.parametrize("method", ["best_fit", "first_fit", "concat"])
def test_the_documented_demo_padding(method):
    from pathlib import Path

    from zephon.demo_corpus import default_workdir

    demo = default_workdir()
    datasets = [open_dataset(f"{demo}/jsonl/source"), open_dataset(f"{demo}/jsonl/docstrings")]
    ops = [Decode("text"), Tokenize(f"{demo}/tokenizer-bpe8192.json", eos_id="<eos>",
                                    max_length=None if method == "concat" else 2048),
           Pack(2048, method=method), Batch(1, drop_last=False)]
    loader = Loader(datasets, ops, weights=[d.num_samples for d in datasets], canonical_replicas=8,
                    exhaustion="stop", runner="threads", num_workers=2)
    rows = tokens = 0
    for mb in loader:
        real = len(mb["input_ids"]) - mb.get("__pad__", 0)
        rows += real
        tokens += int(mb["attention_mask"][:real].sum())
    m = loader.metrics()
    assert (m["rows"], m["tokens"], m["padding_tokens"]) == (rows, tokens, rows * 2048 - tokens)
    doc = " ".join((Path(__file__).parent.parent / "docs" / "metrics.md").read_text().split())
    assert f"{tokens:,} tokens with" in doc and f"`padding_rows` ({m['padding_rows']})" in doc
    assert f"({m['padding_tokens']:,} padding tokens, {rows:,} rows" in doc
    assert f"`padding_fraction` was {100 * m['padding_fraction']:.2f} %" in doc


def test_metrics_are_plain_python_data(tmp_path):
    """Every number of ``metrics()`` is a Python int or float (numpy scalars break YAML's safe_dump, orjson...)."""
    (tmp_path / "a.jsonl").write_text("".join(json.dumps({"text": f"doc {i}"}) + "\n" for i in range(12)))
    ops = [Decode(), Tokenize("bytes", eos_id=2), Pack(16, method="concat"), Batch(2, drop_last=False)]
    loader = Loader([open_dataset(str(tmp_path), name="web")], ops, canonical_replicas=2, global_batch_size=4,
                    exhaustion="stop")
    rows = sum(len(mb["input_ids"]) - mb.get("__pad__", 0) for mb in loader)
    m = loader.metrics()
    assert m["rows"] == rows and m["datasets"]["web"]["samples"] == 12

    def numbers(d):
        for v in d.values():
            if isinstance(v, dict):
                yield from numbers(v)
            else:
                yield v
    assert {type(v) for v in numbers(m)} <= {int, float}, {type(v) for v in numbers(m)}
