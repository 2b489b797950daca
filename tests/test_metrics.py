"""``Loader.metrics()`` against counts made here: documents and tokens per dataset from the JSONL files (the byte
tokenizer's token count is the UTF-8 length plus the EOS), rows, tokens and padding from the micro-batches the test
iterated; and the exporters (callback, Prometheus text and endpoint, TensorBoard) carry the same numbers."""
import json
import re
import urllib.request

import numpy as np
import pytest

from zephon import Batch, Decode, Loader, Pack, Tokenize, open_dataset
from zephon.host import every, flatten, prometheus_text, serve_prometheus, to_tensorboard

SIZES = {"web": 40, "code": 24}
L = 32


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    root = tmp_path_factory.mktemp("metrics")
    texts = {}
    for name, n in SIZES.items():
        (root / name).mkdir()
        texts[name] = [f"{name} document {i} " + "word " * (i % 13) for i in range(n)]
        (root / name / "a.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in texts[name]))
    return root, texts


def _run(corpus, method, runner="threads"):
    root, _ = corpus
    datasets = [open_dataset(str(root / name)) for name in SIZES]
    loader = Loader(datasets, [Decode(), Tokenize("bytes", eos_id=2, max_length=None if method == "concat" else L),
                               Pack(L, method=method), Batch(2, drop_last=False)],
                    weights=list(SIZES.values()), canonical_replicas=4, global_batch_size=8, chunk_size=8,
                    exhaustion="stop", runner=runner, num_workers=2)
    seen = {"rows": 0, "tokens": 0, "pad_rows": 0, "slots": 0}
    for mb in loader:
        pad = mb.get("__pad__", 0)
        real = len(mb["input_ids"]) - pad
        seen["rows"] += real
        seen["pad_rows"] += pad
        seen["tokens"] += int(mb["attention_mask"][:real].sum())
        seen["slots"] += real * mb["input_ids"].shape[1]
    return loader, seen


@pytest.mark.parametrize("method", ["best_fit", "concat"])
def test_metrics_match_counts_made_in_the_test(corpus, method):
    _, texts = corpus
    loader, seen = _run(corpus, method)
    m = loader.metrics()
    for name, ts in texts.items():  # a whole pass: every document once
        assert m["datasets"][name]["samples"] == len(ts)
        assert m["datasets"][name]["tokens"] == sum(len(t.encode()) + 1 for t in ts)
        assert m["datasets"][name]["target_share"] == pytest.approx(SIZES[name] / sum(SIZES.values()))
    total = sum(len(t.encode()) + 1 for ts in texts.values() for t in ts)
    assert m["tokens"] == seen["tokens"] == total
    assert m["rows"] == seen["rows"] and m["padding_rows"] == seen["pad_rows"]
    assert m["padding_tokens"] == seen["slots"] - seen["tokens"]
    if method == "concat":  # only each lane's last row is short
        assert m["padding_tokens"] < 4 * L
    assert m["skipped"] == m["filtered"] == 0
    assert {"read", "decode", "tokenize", "pack"} <= set(m["stage_s"]) and m["units"] > 0
    assert 0 <= m["consumer_wait_fraction"] <= 1 and m["worker_utilization"] >= 0


def test_exporters_carry_the_same_numbers(corpus, tmp_path):
    loader, seen = _run(corpus, "concat", runner="inline")
    m = loader.metrics()
    calls = []
    items = list(every(range(7), loader.metrics, lambda step, mm: calls.append((step, mm["tokens"])), n=3))
    assert items == list(range(7)) and [s for s, _ in calls] == [3, 6, 7] and calls[0][1] == seen["tokens"]
    flat = flatten(m)
    assert flat["zephon/datasets/web/tokens"] == m["datasets"]["web"]["tokens"] and flat["zephon/rows"] == seen["rows"]
    text = prometheus_text(m)
    assert f'zephon_dataset_tokens{{dataset="code"}} {float(m["datasets"]["code"]["tokens"])!r}' in text
    assert f"zephon_padding_tokens {float(seen['slots'] - seen['tokens'])!r}" in text
    server = serve_prometheus(loader.metrics)
    try:
        host, port = server.server_address
        with urllib.request.urlopen(f"http://{host}:{port}/metrics", timeout=10) as r:
            body = r.read().decode()
        assert r.headers["Content-Type"].startswith("text/plain") and f"zephon_rows {float(seen['rows'])!r}" in body
    finally:
        server.shutdown()


def test_tensorboard_writer_gets_every_number(corpus, tmp_path):
    pytest.importorskip("tensorboard")
    SummaryWriter = pytest.importorskip("torch.utils.tensorboard").SummaryWriter
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    loader, seen = _run(corpus, "best_fit", runner="inline")
    with SummaryWriter(str(tmp_path)) as w:
        to_tensorboard(w, loader.metrics(), step=5)
    acc = EventAccumulator(str(tmp_path))
    acc.Reload()
    (ev,) = acc.Scalars("zephon/tokens")
    assert ev.step == 5 and ev.value == np.float32(seen["tokens"])
    assert "zephon/datasets/code/samples" in acc.Tags()["scalars"]


def test_composer_callback_logs_the_metrics_every_n_batches(corpus):
    from zephon_streaming import ZephonMetrics

    loader, seen = _run(corpus, "concat", runner="inline")

    class Logger:  # Composer's Logger.log_metrics(dict) is what the callback calls
        def __init__(self):
            self.logged = []

        def log_metrics(self, metrics):
            self.logged.append(metrics)

    cb, log = ZephonMetrics(loader.metrics, every_n_batches=2), Logger()
    for _ in range(5):
        cb.batch_end(None, log)
    cb.epoch_end(None, log)
    assert len(log.logged) == 3 and all(m["zephon/tokens"] == seen["tokens"] for m in log.logged)
    assert log.logged[0]["zephon/datasets/web/samples"] == SIZES["web"]
    with pytest.raises(ValueError, match="every_n_batches"):
        ZephonMetrics(loader.metrics, every_n_batches=0)


def test_prometheus_label_values_escape_line_feeds_quotes_and_backslashes(corpus):
    """A dataset name with a line feed, a quote and a backslash: every sample stays on one line, and the label value
    read back with the text format's three escapes (undone here by hand) is the name."""
    loader, _ = _run(corpus, "best_fit", runner="inline")
    m = loader.metrics()
    name = 'we\nb "x" a\\b'
    m["datasets"] = {name: m["datasets"]["web"]}
    lines = [ln for ln in prometheus_text(m).splitlines() if ln and not ln.startswith("#")]
    assert all(re.fullmatch(r'[a-z_]+(\{[^\n]*\})? \S+', ln) for ln in lines), lines
    (raw,) = {re.search(r'dataset="((?:[^"\\]|\\.)*)"', ln).group(1) for ln in lines if "dataset=" in ln}
    unescaped = re.sub(r"\\(.)", lambda g: {"n": "\n", '"': '"', "\\": "\\"}[g.group(1)], raw)
    assert unescaped == name


def test_every_reports_once_more_when_the_loop_breaks():
    """A loop that breaks out after 7 items (an endless loader is left that way) still gets the end's report."""
    for stop, expected in ((7, [3, 6, 7]), (6, [3, 6])):  # broken off after 7 items, and after 6 (a report due)
        calls = []
        for k, _ in enumerate(every(iter(range(100)), lambda: {"n": 1}, lambda step, mm: calls.append(step), n=3)):
            if k == stop - 1:
                break
        assert calls == expected, stop
