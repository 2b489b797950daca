"""Lossless finite passes and tight packing (issue 14).

Oracles are computed here, independently of the code under test: the documents the test writes (each
once), their token counts from the ``tokenizers`` library, the packing bound ``ceil(tokens / max_length)``,
and an uninterrupted run for resumes.
"""
from __future__ import annotations

import json
import math
from collections import Counter

import numpy as np
import pytest
from tokenizers import Tokenizer

from helpers import make_loader
from zephon import Batch, Decode, Loader, Pack, Tokenize, open_dataset
from zephon.engine import GlobalBatchHasher

N_DOCS = 1003  # not a multiple of anything below: every pass ends unevenly


@pytest.fixture(scope="module")
def rows_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("rows")
    with open(d / "rows.jsonl", "w") as fh:
        for i in range(N_DOCS):
            fh.write(json.dumps({"text": f"row {i}"}) + "\n")
    return str(d)


def _text_loader(rows_dir, dp, rank, drop_last, **kw):
    return Loader([open_dataset(rows_dir)], [Decode("text"), Batch(2, drop_last=drop_last)], canonical_replicas=8,
                  chunk_size=16, global_batch_size=32, exhaustion="stop", dp_degree=dp, dp_rank=rank,
                  runner="inline", seed=5, **kw)


def _real_rows(mb, key="text"):
    return list(mb[key][:len(mb[key]) - mb.get("__pad__", 0)])


@pytest.mark.parametrize("dp", [1, 2, 4, 8])
def test_finite_pass_without_drop_last_delivers_every_document_once(rows_dir, dp):
    """Every document exactly once, at every dp; every lane of a rank delivers the same micro-batches, each
    full (the pass's last step is padded: ``__pad__`` rows, empty texts)."""
    seen = Counter()
    for rank in range(dp):
        L = _text_loader(rows_dir, dp, rank, drop_last=False)
        per_lane = Counter()
        for mb in L:
            assert len(mb["text"]) == 2
            per_lane[mb["__lane__"]] += 1
            pad = mb.get("__pad__", 0)
            assert all(t == "" for t in mb["text"][len(mb["text"]) - pad:])
            seen.update(_real_rows(mb))
        assert len(set(per_lane.values())) == 1, per_lane
        assert L.stats()["dropped_rows"] == 0
    assert seen == Counter(f"row {i}" for i in range(N_DOCS))


@pytest.mark.parametrize("dp", [1, 2, 4, 8])
def test_finite_pass_with_drop_last_drops_less_than_a_global_batch(rows_dir, dp):
    """Lanes get their share of the pass to within one document, so drop_last leaves out fewer than
    global_batch_size (32) documents, whatever the dp; every step delivered is complete."""
    seen, dropped, steps = Counter(), 0, set()
    for rank in range(dp):
        L = _text_loader(rows_dir, dp, rank, drop_last=True)
        per_step = Counter()
        for mb in L:
            per_step[mb["__step__"]] += len(mb["text"])
            seen.update(mb["text"])
        assert set(per_step.values()) <= {len(L.lanes) * 4}
        steps.add(len(per_step))
        dropped += L.stats()["dropped_rows"]
    assert len(steps) == 1  # every rank the same steps
    assert max(seen.values()) == 1 and set(seen) <= {f"row {i}" for i in range(N_DOCS)}
    assert N_DOCS - len(seen) == dropped < 32


def test_packed_pass_delivers_every_token_once(corpus, tokenizer_path):
    """Tokenize + Pack over a finite pass without drop_last: every document piece once, every token of the
    corpus (counted here with the tokenizer) in a row, padding rows masked out entirely."""
    tok = Tokenizer.from_file(tokenizer_path)
    texts = [json.loads(line)["text"] for f in sorted(__import__("glob").glob(corpus["docs_jsonl"] + "/*.jsonl"))
             for line in open(f, encoding="utf-8") if line.strip()]
    want = sum(len(e.ids) + 1 for e in tok.encode_batch(texts, add_special_tokens=False))  # + <eos>
    for dp in (1, 4):
        tokens, pieces = 0, Counter()
        for rank in range(dp):
            L = make_loader([corpus["docs_jsonl"]], tokenizer_path, dp=dp, rank=rank, exhaustion="stop",
                            drop_last=False, max_length=128)
            for mb in L:
                pad = mb.get("__pad__", 0)
                assert mb["attention_mask"][len(mb["attention_mask"]) - pad:].sum() == 0
                tokens += int(mb["attention_mask"].sum())
                for src in mb["__src__"]:
                    pieces.update(tuple(p) for p in src)
        assert tokens == want, dp
        assert max(pieces.values()) == 1 and len({p for p, _ in pieces}) == len(texts)


@pytest.fixture(scope="module")
def short_docs(tmp_path_factory):
    """12,000 short documents, lognormal lengths around 80 tokens (5 to 2048, ``<eos>`` included), and a
    word-level tokenizer for which a document of ``n`` tokens is ``n - 1`` words."""
    from tokenizers import models, pre_tokenizers

    rng = np.random.default_rng(7)
    lengths = np.clip(rng.lognormal(np.log(80), 0.7, 12_000).astype(int), 5, 2048)
    d = tmp_path_factory.mktemp("short")
    with open(d / "docs.jsonl", "w") as fh:
        for n in lengths:
            fh.write(json.dumps({"text": " ".join(["w"] * (int(n) - 1))}) + "\n")
    tok = Tokenizer(models.WordLevel({"<pad>": 0, "<eos>": 1, "w": 2, "<unk>": 3}, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.save(str(d / "tok.json"))
    return str(d / "docs.jsonl"), lengths, str(d / "tok.json")


def _short_ops(tok, drop_last=True):
    return [Decode(), Tokenize(tok, eos_id="<eos>", max_length=2048), Pack(2048), Batch(1, drop_last=drop_last)]


def test_default_packing_pads_under_half_a_percent_on_short_documents(short_docs):
    """Pack(2048) at its defaults over an endless stream of short documents, 8 lanes, flush sentinels every
    256 pointers: padding under 0.5% of the row tokens (earlier defaults, which padded every open bin out at
    each sentinel, gave about 4%). Deterministic: a count, not a timing."""
    path, lengths, tok = short_docs
    L = Loader([open_dataset(path)], _short_ops(tok), canonical_replicas=8, runner="inline")
    rows = tokens = 0
    for mb in L:
        rows += 1
        tokens += int(mb["attention_mask"].sum())
        if rows == 8 * 60:
            break
    padding = 1 - tokens / (rows * 2048)
    assert padding < 0.005, padding
    assert tokens > 0.75 * lengths.sum()  # ~1,200 documents per lane went through: 4 flush spans and more


def test_finite_packed_pass_is_near_the_bound(short_docs):
    """A finite pass over 8 lanes: every token once, rows at most 0.5% above the bound ceil(tokens / 2048)
    plus one partly filled row per lane (the pass ends in every lane)."""
    path, lengths, tok = short_docs
    L = Loader([open_dataset(path)], _short_ops(tok, drop_last=False), canonical_replicas=8, exhaustion="stop",
               runner="inline")
    rows = tokens = 0
    for mb in L:
        rows += 1 - mb.get("__pad__", 0)
        tokens += int(mb["attention_mask"].sum())
    bound = math.ceil(lengths.sum() / 2048)
    assert tokens == lengths.sum()
    assert rows <= bound * 1.005 + 8, (rows, bound)


def test_packing_carries_open_bins_across_sentinels_and_resumes_exactly(corpus, tokenizer_path):
    """With sentinels every 16 pointers, checkpoints name carried documents (``carry``); resuming from them at
    another dp gives the uninterrupted run's global batches, and 64 lanes' checkpoint stays under 64 KiB."""
    kw = dict(canonical_replicas=8, chunk_size=32, flush_every_k_chunks=0.5, shuffle_buffer=0, max_length=256)
    ref = GlobalBatchHasher()
    L = make_loader([corpus["docs_jsonl"], corpus["code_jsonl"]], tokenizer_path, **kw)
    states = {}
    for k, mb in enumerate(L):  # 16 micro-batches of 1 row per step (8 lanes x 2 rows)
        if mb["__step__"] >= 24:
            break
        ref.add(mb)
        if (k + 1) % 16 == 0 and (k + 1) // 16 in (5, 11, 17):  # the state after step 4, 10, 16
            states[(k + 1) // 16] = json.loads(json.dumps(L.checkpoint()))
    want = ref.digests()
    assert sorted(want) == list(range(24))
    assert any("carry" in e for s in states.values() for e in s["lanes"]), "no sentinel carried a document"
    for step, state in states.items():
        got = GlobalBatchHasher()
        for rank in range(2):
            R = make_loader([corpus["docs_jsonl"], corpus["code_jsonl"]], tokenizer_path, dp=2, rank=rank, **kw)
            R.restore(state)
            for mb in R:
                if mb["__step__"] >= 24:
                    break
                got.add(mb)
        assert got.digests() == {s: h for s, h in want.items() if s >= step}, step
    big = make_loader([corpus["docs_jsonl"], corpus["code_jsonl"]], tokenizer_path, **dict(kw, canonical_replicas=64))
    it = iter(big)
    for _ in range(64 * 4):
        next(it)
    size = len(json.dumps(big.checkpoint()))
    it.close()
    assert size <= 64 * 1024, size


def test_a_checkpoint_taken_after_the_pass_ended_resumes_to_nothing(rows_dir, corpus, tokenizer_path):
    """The end-of-pass checkpoint (the most common one) restores at any dp into a loader that yields nothing:
    no padding step is owed, nothing is repeated (found by a new user: it raised before)."""
    for drop_last in (False, True):
        L = _text_loader(rows_dir, 1, 0, drop_last=drop_last)
        assert sum(1 for _ in L) > 0
        state = json.loads(json.dumps(L.checkpoint()))
        for dp in (1, 2, 4):
            for rank in range(dp):
                R = _text_loader(rows_dir, dp, rank, drop_last=drop_last)
                R.restore(state)
                assert list(R) == [], (drop_last, dp)
    P = make_loader([corpus["docs_jsonl"]], tokenizer_path, exhaustion="stop", drop_last=False, max_length=128)
    assert sum(1 for _ in P) > 0
    state = P.checkpoint()
    R = make_loader([corpus["docs_jsonl"]], tokenizer_path, dp=2, rank=1, exhaustion="stop", drop_last=False,
                    max_length=128)
    R.restore(state)
    assert list(R) == []


def test_packed_padding_needs_no_delivered_row(tmp_path, tokenizer_path):
    """A rank whose lanes deliver nothing in a packed pass (every document of its lanes filtered out) still pads
    the steps another rank goes on with: the padding row's shape comes from Pack(max_length), not from a
    delivered row. The other rank's vote is played by a StepAgreement that says "continue" twice."""
    from zephon import Filter
    from zephon.host import RankSession, StepAgreement

    class OtherRankGoesOn(StepAgreement):
        def __init__(self, steps):
            super().__init__()
            self.left = steps

        def agree(self, complete, any_rank=False):
            self.left -= 1
            return complete or self.left >= 0

    (tmp_path / "d.jsonl").write_text("".join(json.dumps({"text": f"doc {i} " * 5, "keep": i < 8}) + "\n"
                                              for i in range(16)))
    ops = [Decode(keep=("keep",)), Filter(_keep), Tokenize(tokenizer_path, eos_id="<eos>", max_length=64),
           Pack(64), Batch(1, drop_last=False)]

    s = RankSession.from_config([open_dataset(str(tmp_path))], ops, canonical_replicas=2, chunk_size=8,
                                shuffle=False, exhaustion="stop", dp_degree=2, dp_rank=1)
    s._agreement = OtherRankGoesOn(2)
    groups = list(s.ordered_groups(s.worker_items(0, 0)))
    assert len(groups) == 2  # two steps of one micro-batch (rows_per_lane_step 1), both padding
    for g in groups:
        (meta, mb), = g
        assert meta["pad"] == 1 and mb["attention_mask"].shape == (1, 64) and mb["attention_mask"].sum() == 0
        assert mb["labels"].tolist() == [[-100] * 64]
    assert s.rank_state()["lanes"][0]["delivered_rows"] == 2


def _keep(record) -> bool:
    return bool(record["keep"])


def _keep_second_half(record):
    return int(record["text"].split()[-1]) >= 150


def _drop_first_forty(record):
    return int(record["text"].split()[-1]) >= 40


def test_drop_last_pass_that_delivers_no_step_is_an_error_and_large_drops_warn(tmp_path):
    """A new user's case: a filter leaves lanes 0-1 of a finite, unshuffled pass empty. With drop_last=True no step
    completes: the whole pass would vanish into ``dropped_rows``. It raises instead, naming the empty lanes; when
    some steps complete but more than a step's rows are dropped, a warning says so."""
    from zephon import Filter
    from zephon.formats import DataError, DataWarning

    with open(tmp_path / "docs.jsonl", "w") as f:
        for i in range(300):
            f.write(json.dumps({"text": f"doc {i}"}) + "\n")

    def loader(keep):
        ops = [Decode("text")] + ([Filter(keep)] if keep else []) + [Batch(2, drop_last=True)]
        return Loader([open_dataset(str(tmp_path))], ops, canonical_replicas=4, global_batch_size=8,
                      exhaustion="stop", shuffle=False, runner="inline")

    with pytest.raises(DataError, match=r"delivered no step.*lanes \[0, 1\].*drop_last=False"):
        list(loader(_keep_second_half))  # lanes 0-1 hold docs 0-149, all filtered
    L = loader(_drop_first_forty)  # lane 0 keeps 35 of its 75 docs: 17 steps, then 124 rows dropped
    with pytest.warns(DataWarning, match=r"lanes \[0\].*124 rows left"):
        rows = sum(len(mb["text"]) for mb in L)
    assert rows == 17 * 8 and L.stats()["dropped_rows"] == 124
    # without the filter every lane holds 75 rows: the pass ends on a short step (3 rows of 75 dropped per lane)
    L = loader(None)
    import warnings as w
    with w.catch_warnings():
        w.simplefilter("error", DataWarning)  # a normal short last step is dropped quietly
        rows = sum(len(mb["text"]) for mb in L)
    assert rows + L.stats()["dropped_rows"] == 300 and L.stats()["dropped_rows"] < 8
