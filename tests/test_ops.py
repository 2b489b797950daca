"""zephon.ops: tokenize, pack, shuffle, mixture, decode/map/filter, collate, token-corrected weights.

Expected values come from independent computations: the ``tokenizers`` library itself, naive
best-fit / first-fit bin packing written here, a pure-Python splitmix64 + BLAKE2b reference for the
shuffle hash, plain-Python counters and arithmetic. Never from the operators' own output.
"""
from __future__ import annotations

import collections
import functools
import hashlib
import itertools
import json
import os
import pickle
import random
import re
import string
import textwrap

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from zephon.ops import (Decode, EnsureMixture, Filter, Map, Pack, RecordError, Shuffle, Tokenize, collate,
                        token_corrected_weights)

FAST = settings(max_examples=40, deadline=None, database=None)
MASK64 = (1 << 64) - 1


# ---------------------------------------------------------------- tokenizer fixture


DOCS = [m.__doc__ for m in (json, os, re, collections, functools, itertools, textwrap, string, pickle, random)]
EXTRA_TEXTS = ["", " ", "héllo wörld, 漢字 and emoji 🙂🙂", "tab\tand\nnewline", "x" * 300,
               "<eos> is just text here", "a"]


@pytest.fixture(scope="module")
def tok():
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    t = Tokenizer(models.BPE())
    t.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    t.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=600, special_tokens=["<pad>", "<eos>", "<bos>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    t.train_from_iterator(DOCS, trainer)
    return t


def text_records(texts, dataset=0):
    return [{"text": t, "__src__": (dataset, 0, i, 100 + i), "other": i} for i, t in enumerate(texts)]


ALL_TEXTS = DOCS + EXTRA_TEXTS


def by_src(out):
    groups = collections.defaultdict(list)
    for r in out:
        groups[r["__src__"]].append(r)
    return groups


# ---------------------------------------------------------------- Tokenize


def test_special_token_ids(tok):
    # special tokens are added first by the trainer, in the order given
    assert [tok.token_to_id(s) for s in ("<pad>", "<eos>", "<bos>")] == [0, 1, 2]


@pytest.mark.parametrize("cfg,prefix,suffix", [
    (dict(eos_id="<eos>"), [], [1]),
    (dict(eos_id=1), [], [1]),
    (dict(add_eos=False), [], []),
    (dict(add_bos=True, bos_id="<bos>", add_eos=False), [2], []),
    (dict(add_bos=True, bos_id="<bos>", eos_id="<eos>"), [2], [1]),
    (dict(add_bos=True, bos_id=7, eos_id=9), [7], [9]),
])
def test_tokenize_ids_match_tokenizer(tok, cfg, prefix, suffix):
    op = Tokenize(tok, **cfg)
    recs = text_records(ALL_TEXTS)
    out = op.process_many(recs)
    assert len(out) == len(recs)
    for r, o in zip(recs, out):
        expected = prefix + tok.encode(r["text"], add_special_tokens=False).ids + suffix
        assert o["input_ids"].dtype == np.int32
        assert o["input_ids"].tolist() == expected
        assert o["num_tokens"] == len(expected)
        assert o["__src__"] == r["__src__"]
        assert o["__piece__"] == 0
    assert op.process_many([]) == []


def test_tokenize_other_field_and_loading_forms(tok, tmp_path):
    path = tmp_path / "tokenizer.json"
    tok.save(str(path))
    recs = [{"body": t, "__src__": (0, 0, i, i)} for i, t in enumerate(ALL_TEXTS)]
    expected = [tok.encode(t, add_special_tokens=False).ids + [1] for t in ALL_TEXTS]
    for form in (tok, str(path), path, tok.to_str()):
        out = Tokenize(form, field="body", eos_id="<eos>").process_many(recs)
        assert [o["input_ids"].tolist() for o in out] == expected
    with pytest.raises(FileNotFoundError):
        Tokenize(str(tmp_path / "missing.json"), eos_id=1)


def test_tokenize_invalid_arguments(tok):
    with pytest.raises(ValueError):
        Tokenize(tok)  # add_eos=True by default needs eos_id
    with pytest.raises(ValueError):
        Tokenize(tok, add_bos=True, add_eos=False)
    with pytest.raises(ValueError):
        Tokenize(tok, eos_id="<not-a-token>")
    with pytest.raises(ValueError):
        Tokenize(tok, eos_id=1, max_length=0)


def test_tokenize_missing_field_names_record(tok):
    recs = text_records(["fine", "also fine"])
    bad = {"body": "no text field", "__src__": (3, 4, 5, 6)}
    with pytest.raises(RecordError) as ei:
        Tokenize(tok, eos_id=1).process_many(recs[:1] + [bad] + recs[1:])
    assert ei.value.src == (3, 4, 5, 6)


@FAST
@given(st.integers(1, 60), st.booleans(), st.booleans())
def test_tokenize_max_length_split(tok, max_length, add_bos, add_eos):
    op = Tokenize(tok, add_bos=add_bos, bos_id=2, add_eos=add_eos, eos_id=1, max_length=max_length)
    recs = text_records(ALL_TEXTS)
    out = op.process_many(recs)
    groups = by_src(out)
    assert set(groups) == {r["__src__"] for r in recs}
    for r in recs:
        full = ([2] if add_bos else []) + tok.encode(r["text"], add_special_tokens=False).ids + ([1] if add_eos else [])
        pieces = groups[r["__src__"]]
        assert [p["__piece__"] for p in pieces] == list(range(len(pieces)))
        assert sum((p["input_ids"].tolist() for p in pieces), []) == full
        for p in pieces:
            assert p["input_ids"].size <= max_length
            assert p["num_tokens"] == p["input_ids"].size
            assert p["input_ids"].dtype == np.int32
        if len(full) > 0:
            assert all(p["input_ids"].size > 0 for p in pieces)  # no empty pieces
            assert len(pieces) == -(-len(full) // max_length)   # nothing wasted: ceil(n / max_length)
    # order: records in input order, pieces in order
    assert [o["__src__"] for o in out] == sorted((o["__src__"] for o in out), key=lambda s: s[2])


@FAST
@given(st.lists(st.integers(0, len(ALL_TEXTS)), max_size=5), st.sampled_from([None, 7, 50]))
def test_tokenize_batching_independent(tok, cuts, max_length):
    op = Tokenize(tok, eos_id=1, max_length=max_length)
    recs = text_records(ALL_TEXTS)
    whole = op.process_many(recs)
    bounds = [0] + sorted(cuts) + [len(recs)]
    parts = []
    for a, b in zip(bounds, bounds[1:]):
        parts.extend(op.process_many(recs[a:b]))
    assert len(parts) == len(whole)
    for x, y in zip(whole, parts):
        assert x["input_ids"].tolist() == y["input_ids"].tolist()
        assert (x["__src__"], x["__piece__"], x["num_tokens"]) == (y["__src__"], y["__piece__"], y["num_tokens"])
    # one record at a time too
    singles = [o for r in recs for o in op.process_many([r])]
    assert [o["input_ids"].tolist() for o in singles] == [o["input_ids"].tolist() for o in whole]


def test_tokenize_survives_pickling(tok):
    op = Tokenize(tok, add_bos=True, bos_id="<bos>", eos_id="<eos>", max_length=16)
    op2 = pickle.loads(pickle.dumps(op))
    recs = text_records(ALL_TEXTS)
    a, b = op.process_many(recs), op2.process_many(recs)
    assert [(o["input_ids"].tolist(), o["__src__"], o["__piece__"]) for o in a] == \
           [(o["input_ids"].tolist(), o["__src__"], o["__piece__"]) for o in b]
    assert op.fingerprint() == op2.fingerprint()
    json.dumps(op.fingerprint())  # plain JSON
    assert Tokenize(tok, eos_id=1, max_length=16).fingerprint() != Tokenize(tok, eos_id=1, max_length=17).fingerprint()


# ---------------------------------------------------------------- Pack


def doc_record(i, n):
    return {"input_ids": np.arange(n, dtype=np.int32) + 1000 * i, "__src__": (0, 0, i, i), "__piece__": 0,
            "num_tokens": n}


def naive_pack(lengths, cap, method, max_open):
    """Naive bin packing: returns [(step, [doc ids])] where step is the push index (len(lengths) = flush)."""
    open_bins = []  # [bin id, docs, room]
    next_id = 0
    out = []
    for step, n in enumerate(lengths):
        fits = [b for b in open_bins if b[2] >= n]
        if fits:
            if method == "best_fit":
                b = min(fits, key=lambda b: (b[2], b[0]))
            else:
                b = min(fits, key=lambda b: b[0])
        else:
            b = [next_id, [], cap]
            next_id += 1
            open_bins.append(b)
        b[1].append(step)
        b[2] -= n
        if b[2] == 0:
            open_bins.remove(b)
            out.append((step, b[1]))
        elif len(open_bins) > max_open:
            v = min(open_bins, key=lambda b: (b[2], b[0]))
            open_bins.remove(v)
            out.append((step, v[1]))
    # the final flush re-packs what is open: longest first (ties in bin then arrival order), first fit
    left = [d for b in sorted(open_bins, key=lambda b: b[0]) for d in b[1]]
    left = sorted(left, key=lambda d: -lengths[d])
    rebins = []  # [docs, used]
    for d in left:
        for b in rebins:
            if b[1] + lengths[d] <= cap:
                b[0].append(d)
                b[1] += lengths[d]
                break
        else:
            rebins.append([[d], lengths[d]])
    out.extend((len(lengths), b[0]) for b in rebins)
    return out


def run_pack(acc, lengths):
    out = []
    for i, n in enumerate(lengths):
        for row in acc.push(doc_record(i, n)):
            out.append((i, row))
    for row in acc.flush():
        out.append((len(lengths), row))
    return out


def check_row(row, lengths, cap, pad_id=0, label_pad=-100):
    docs = [pos for pos, piece in row["__src__"]]
    assert all(piece == 0 for _, piece in row["__src__"])
    ids, labels, pos, mask, cu = (row["input_ids"], row["labels"], row["position_ids"], row["attention_mask"],
                                  row["cu_seqlens"])
    for a in (ids, labels, pos, mask):
        assert a.shape == (cap,)
    assert ids.dtype == np.int32 and labels.dtype == np.int32 and pos.dtype == np.int32
    assert mask.dtype == np.uint8 and cu.dtype == np.int32
    expected_cu = [0]
    for d in docs:
        expected_cu.append(expected_cu[-1] + lengths[d])
    assert cu.tolist() == expected_cu
    used = expected_cu[-1]
    assert row["num_tokens"] == used <= cap
    ids_l, labels_l, pos_l, mask_l = ids.tolist(), labels.tolist(), pos.tolist(), mask.tolist()
    starts = set()
    for k, d in enumerate(docs):  # each document contiguous and unchanged
        a, b = expected_cu[k], expected_cu[k + 1]
        assert ids_l[a:b] == [1000 * d + j for j in range(lengths[d])]
        assert pos_l[a:b] == list(range(lengths[d]))
        if b > a:
            starts.add(a)
    assert ids_l[used:] == [pad_id] * (cap - used)
    assert mask_l == [1] * used + [0] * (cap - used)
    assert labels_l == [label_pad if (j >= used or j in starts) else ids_l[j] for j in range(cap)]
    return docs


@FAST
@given(st.data(), st.integers(1, 40), st.integers(1, 4), st.sampled_from(["best_fit", "first_fit"]))
def test_pack_matches_naive_and_rows_are_valid(data, cap, max_open, method):
    lengths = data.draw(st.lists(st.integers(1, cap), max_size=60), label="lengths")
    op = Pack(max_length=cap, method=method, max_open_bins=max_open)
    acc = op.new_accumulator(0)
    got = run_pack(acc, lengths)
    rows = [(step, check_row(row, lengths, cap)) for step, row in got]
    assert rows == naive_pack(lengths, cap, method, max_open)
    # every document exactly once
    assert sorted(d for _, docs in rows for d in docs) == list(range(len(lengths)))
    # flush reset: the same input again gives the same output
    again = run_pack(acc, lengths)
    assert [(s, check_row(r, lengths, cap)) for s, r in again] == rows
    assert [r["input_ids"].tolist() for _, r in again] == [r["input_ids"].tolist() for _, r in got]


@FAST
@given(st.data(), st.integers(1, 40), st.integers(1, 4), st.integers(0, 6), st.sampled_from(["best_fit", "first_fit"]))
def test_pack_carry_then_resume_continues_as_if_uninterrupted(data, cap, max_open, max_carry, method):
    """A sentinel that carries (``carry``) and a fresh accumulator ``resume``d from the carried documents give
    the rows an accumulator that carried and kept going gives; at most ``max_carry`` documents are carried;
    nothing is lost or doubled. The oracle for "kept going" is the same accumulator, not rebuilt."""
    lengths = data.draw(st.lists(st.integers(1, cap), max_size=50), label="lengths")
    cut = data.draw(st.integers(0, len(lengths)), label="sentinel")
    op = Pack(max_length=cap, method=method, max_open_bins=max_open, max_carry=max_carry)

    def docs_of(rows):
        return [[p for p, _ in r["__src__"]] for r in rows]

    a = op.new_accumulator(0)
    head = [r for i in range(cut) for r in a.push(doc_record(i, lengths[i]))]
    emitted, held = a.carry()
    assert sum(len(b) for b in held) <= max_carry
    b = op.new_accumulator(0)
    b.resume([[doc_record(d["__src__"][3], lengths[d["__src__"][3]]) for d in bin_] for bin_ in held])
    tails = []
    for acc in (a, b):
        tails.append([r for i in range(cut, len(lengths)) for r in acc.push(doc_record(i, lengths[i]))]
                     + acc.flush())
    assert docs_of(tails[0]) == docs_of(tails[1])
    for r in head + emitted + tails[1]:
        check_row(r, lengths, cap)
    everything = [d for docs in docs_of(head + emitted + tails[1]) for d in docs]
    assert sorted(everything) == list(range(len(lengths)))


def test_pack_custom_pad_and_label_pad():
    lengths = [3, 5, 2, 7, 1, 4]
    op = Pack(max_length=8, method="best_fit", max_open_bins=2, pad_id=5, label_pad=-1)
    got = run_pack(op.new_accumulator(3), lengths)
    docs = [check_row(r, lengths, 8, pad_id=5, label_pad=-1) for _, r in got]
    assert [(s, d) for (s, _), d in zip(got, docs)] == naive_pack(lengths, 8, "best_fit", 2)


def test_pack_handcrafted_best_vs_first_fit():
    # cap 10: docs 6, 5, 4 -> bins {0:[6] room 4}, {1:[5] room 5}; doc 4: best fit -> bin 0 (full),
    # first fit -> bin 0 as well; doc 3 then: best -> bin 1 (room 5), first -> bin 1.
    lengths = [6, 5, 3, 4, 2]
    best = run_pack(Pack(10, "best_fit", 8).new_accumulator(0), lengths)
    first = run_pack(Pack(10, "first_fit", 8).new_accumulator(0), lengths)
    # best fit: 6->b0(4), 5->b1(5), 3->b0(1), 4->b1(1), 2->b2(8); the flush re-packs 6,5,4,3,2 (docs 0,1,3,2,4)
    # longest first: 6 -> A, 5 -> B, 4 -> A (full), 3 -> B, 2 -> B (full): two rows where three bins were open
    assert [[p for p, _ in r["__src__"]] for _, r in best] == [[0, 3], [1, 2, 4]]
    # first fit: 6->b0(4), 5->b1(5), 3->b0(1), 4->b1(1), 2->b2; the same re-pack
    assert [[p for p, _ in r["__src__"]] for _, r in first] == [[0, 3], [1, 2, 4]]
    lengths = [5, 6, 4, 4]
    # best: 5->b0(5), 6->b1(4), 4->b1 (room 4 < 5) full -> emitted at step 2, 4->b0(1)
    best = run_pack(Pack(10, "best_fit", 8).new_accumulator(0), lengths)
    assert [(s, [p for p, _ in r["__src__"]]) for s, r in best] == [(2, [1, 2]), (4, [0, 3])]
    # first: 5->b0(5), 6->b1(4), 4->b0(1), 4->b1 full
    first = run_pack(Pack(10, "first_fit", 8).new_accumulator(0), lengths)
    assert [(s, [p for p, _ in r["__src__"]]) for s, r in first] == [(3, [1, 3]), (4, [0, 2])]


def test_pack_too_long_document_raises():
    acc = Pack(max_length=8).new_accumulator(0)
    assert acc.push(doc_record(0, 8))  # exactly full is fine, emitted at once
    bad = doc_record(7, 9)
    with pytest.raises(RecordError) as ei:
        acc.push(bad)
    assert ei.value.src == (0, 0, 7, 7)


def test_pack_invalid_arguments():
    with pytest.raises(ValueError):
        Pack(method="worst_fit")
    with pytest.raises(ValueError):
        Pack(max_length=0)
    with pytest.raises(ValueError):
        Pack(max_open_bins=0)


# ---------------------------------------------------------------- Shuffle


def py_mix64(x: int) -> int:
    """splitmix64 finaliser in plain Python integers."""
    x &= MASK64
    x ^= x >> 30
    x = (x * 0xBF58476D1CE4E5B9) & MASK64
    x ^= x >> 27
    x = (x * 0x94D049BB133111EB) & MASK64
    x ^= x >> 31
    return x


def py_derive_key(*parts) -> int:
    blob = json.dumps(parts, separators=(",", ":"), sort_keys=True, default=str).encode()
    return int.from_bytes(hashlib.blake2b(blob, digest_size=8).digest(), "little")


def py_identity(rec) -> int:
    src = rec["__src__"]
    if isinstance(src, list):
        position, piece = src[0]
    else:
        position, piece = src[3], rec.get("__piece__", 0)
    return (position << 16) + piece


def py_shuffle(records, buffer_size, seed, lane):
    """Reference shuffle buffer: fill, then the arriving element's hash picks the slot that leaves;
    the flush drains in hash order."""
    lane_key = py_mix64(py_derive_key("shuffle", seed) ^ lane)
    h = lambda r: py_mix64(py_identity(r) ^ lane_key)  # noqa: E731
    buf, out = [], []
    for r in records:
        if len(buf) < buffer_size:
            buf.append(r)
        else:
            j = h(r) % buffer_size
            out.append(buf[j])
            buf[j] = r
    out.extend(sorted(buf, key=h))
    return out


def shuf_records(n, seed=0):
    rng = random.Random(seed)
    positions = rng.sample(range(10 ** 9), n)
    return [{"v": k, "__src__": (0, 0, k, p), "__piece__": rng.randrange(3)} for k, p in enumerate(positions)]


def run_acc(acc, records):
    out = []
    for r in records:
        out.extend(acc.push(r))
    return out, acc.flush()


@FAST
@given(st.integers(0, 120), st.integers(1, 40), st.integers(0, 3), st.integers(0, 7))
def test_shuffle_is_permutation_and_deterministic(n, buffer_size, seed, lane):
    recs = shuf_records(n, seed=n)
    op = Shuffle(buffer_size=buffer_size, seed=seed)
    pushed, flushed = run_acc(op.new_accumulator(lane), recs)
    out = pushed + flushed
    assert sorted(r["v"] for r in out) == list(range(n))
    assert len(pushed) == max(0, n - buffer_size)  # one out per arrival once the buffer is full
    # matches the documented identity-hash buffer
    assert [r["v"] for r in out] == [r["v"] for r in py_shuffle(recs, buffer_size, seed, lane)]
    # deterministic: a fresh accumulator, and the same one after its flush
    acc = Shuffle(buffer_size=buffer_size, seed=seed).new_accumulator(lane)
    assert [r["v"] for r in sum(run_acc(acc, recs), [])] == [r["v"] for r in out]
    assert [r["v"] for r in sum(run_acc(acc, recs), [])] == [r["v"] for r in out]


def test_shuffle_full_buffer_sorted_by_hash_and_sensitive_to_seed_and_lane():
    recs = shuf_records(300, seed=1)
    orders = {}
    for seed in (0, 1):
        for lane in (0, 1, 5):
            pushed, flushed = run_acc(Shuffle(buffer_size=300, seed=seed).new_accumulator(lane), recs)
            assert pushed == []
            lane_key = py_mix64(py_derive_key("shuffle", seed) ^ lane)
            assert [r["v"] for r in flushed] == [r["v"] for r in
                                                sorted(recs, key=lambda r: py_mix64(py_identity(r) ^ lane_key))]
            orders[(seed, lane)] = tuple(r["v"] for r in flushed)
    assert len(set(orders.values())) == len(orders)  # every seed and lane gives its own order
    assert tuple(range(300)) not in set(orders.values())


def test_shuffle_identity_of_packed_rows():
    # rows built from several documents use their first document's (position, piece)
    rows = [{"v": k, "__src__": [(10 * k + 3, k % 2), (999, 0)]} for k in range(50)]
    pushed, flushed = run_acc(Shuffle(buffer_size=8, seed=4).new_accumulator(2), rows)
    assert [r["v"] for r in pushed + flushed] == [r["v"] for r in py_shuffle(rows, 8, 4, 2)]


def test_shuffle_invalid_buffer():
    with pytest.raises(ValueError):
        Shuffle(buffer_size=0)


# ---------------------------------------------------------------- EnsureMixture


def mix_records(spec, order_seed=None, bursty=False):
    """spec: list of (dataset id, length) per document; returns records in the requested input order."""
    recs = [{"num_tokens": n, "__src__": (d, 0, k, k), "input_ids": np.zeros(n, np.int32)}
            for k, (d, n) in enumerate(spec)]
    if bursty:
        recs.sort(key=lambda r: -r["__src__"][0])  # every long (dataset 1) document first
    elif order_seed is not None:
        random.Random(order_seed).shuffle(recs)
    return recs


def normalised_spread(stream, weights):
    """max over prefixes of (max_d r_d/w_d - min_d r_d/w_d), r_d = released tokens of dataset d."""
    r = [0] * len(weights)
    worst = 0.0
    for rec in stream:
        r[rec["__src__"][0]] += rec["num_tokens"]
        vals = [r[d] / weights[d] for d in range(len(weights))]
        worst = max(worst, max(vals) - min(vals))
    return worst


@pytest.mark.parametrize("weights,spec_fn", [
    ([0.5, 0.5], lambda rng: [(0, 10)] * 600 + [(1, 100)] * 60),
    ([0.5, 0.5], lambda rng: ([(0, rng.randint(1, 20)) for _ in range(500)]
                              + [(1, rng.randint(60, 140)) for _ in range(50)])),
    ([1, 3], lambda rng: ([(0, rng.randint(5, 15)) for _ in range(300)]
                          + [(1, rng.randint(80, 100)) for _ in range(100)])),
])
@pytest.mark.parametrize("order", ["bursty", "random"])
def test_ensure_mixture_token_shares(weights, spec_fn, order):
    rng = random.Random(7)
    spec = spec_fn(rng)
    recs = mix_records(spec, order_seed=3, bursty=order == "bursty")
    op = EnsureMixture(weights, buffer_size=10 ** 6)  # never forced: only the deficit rule releases
    pushed, flushed = run_acc(op.new_accumulator(0), recs)
    out = pushed + flushed
    # nothing lost, nothing duplicated; per-dataset order kept (FIFO queues)
    assert sorted(r["__src__"] for r in out) == sorted(r["__src__"] for r in recs)
    for d in range(len(weights)):
        assert ([r["__src__"] for r in out if r["__src__"][0] == d]
                == [r["__src__"] for r in recs if r["__src__"][0] == d])
    # Bound: a release always comes from the dataset with the smallest r_d / w_d and raises it by at most
    # L_d / w_d, so max - min of r_d / w_d never exceeds max_d (L_d / w_d) while every dataset still has
    # documents left. With equal-or-proportional totals that holds to the very end.
    w = [x / sum(weights) for x in weights]
    bound = max(max(n for dd, n in spec if dd == d) / w[d] for d in range(len(w)))
    totals = [sum(n for dd, n in spec if dd == d) for d in range(len(w))]
    slack = max(totals[d] / w[d] for d in range(len(w))) - min(totals[d] / w[d] for d in range(len(w)))
    got = normalised_spread(out, w)
    assert got <= bound + slack + 1e-9
    assert got < normalised_spread(recs, w)  # the input order is worse
    if weights == [0.5, 0.5] and slack == 0:
        r0 = r1 = 0
        for rec in out:
            if rec["__src__"][0] == 0:
                r0 += rec["num_tokens"]
            else:
                r1 += rec["num_tokens"]
            if r0 + r1 >= 2000:  # |share - 1/2| = |r0 - r1| / (2 (r0 + r1)) <= L_max / 4000
                assert abs(r0 / (r0 + r1) - 0.5) <= 100 / 4000 + 1e-12


@pytest.mark.parametrize("cap", [1, 2, 5, 17])
def test_ensure_mixture_buffer_cap_and_flush(cap):
    rng = random.Random(cap)
    spec = [(rng.randrange(3), rng.randint(1, 50)) for _ in range(200)]
    recs = mix_records(spec)
    acc = EnsureMixture([1, 1, 2], buffer_size=cap).new_accumulator(0)
    released = 0
    out = []
    for k, r in enumerate(recs):
        got = acc.push(r)
        released += len(got)
        out.extend(got)
        assert (k + 1) - released < max(cap, 1)  # never holds buffer_size documents after a push
    rest = acc.flush()
    out.extend(rest)
    assert len(out) == len(recs)
    assert sorted(r["__src__"] for r in out) == sorted(r["__src__"] for r in recs)
    assert acc.flush() == []
    # after a flush the accumulator is as new
    acc2 = EnsureMixture([1, 1, 2], buffer_size=cap).new_accumulator(0)
    again = sum(run_acc(acc, recs), [])
    fresh = sum(run_acc(acc2, recs), [])
    assert [r["__src__"] for r in again] == [r["__src__"] for r in fresh] == [r["__src__"] for r in out]


# ---------------------------------------------------------------- Decode, Map, Filter


def test_decode_text_and_bytes():
    recs = [{"text": "plain", "__src__": (0, 1, 2, 3), "x": 1, "y": 2},
            {"text": "ünï 漢".encode("utf-8"), "__src__": (0, 1, 3, 4), "x": 5},
            {"text": b"", "__src__": (0, 1, 4, 5)}]
    out = Decode(keep=("x",)).process_many(recs)
    assert out == [{"text": "plain", "__src__": (0, 1, 2, 3), "x": 1},
                   {"text": "ünï 漢", "__src__": (0, 1, 3, 4), "x": 5},
                   {"text": "", "__src__": (0, 1, 4, 5), "x": None}]
    out = Decode(field="y").process_many([{"y": b"abc", "__src__": (1, 0, 0, 0)}])
    assert out == [{"y": "abc", "__src__": (1, 0, 0, 0)}]


@pytest.mark.parametrize("bad", [{"body": "x"}, {"text": b"\xff\xfe bad"}, {"text": b"ok \xc3"}, {"text": 12},
                                 {"text": None}])
def test_decode_errors_name_the_record(bad):
    bad = dict(bad, __src__=(2, 7, 11, 99))
    recs = [{"text": "fine", "__src__": (2, 7, 10, 98)}, bad]
    with pytest.raises(RecordError) as ei:
        Decode().process_many(recs)
    assert ei.value.src == (2, 7, 11, 99)
    assert isinstance(ei.value, ValueError)


def upper_text(r):
    return {"text": r["text"].upper()}


def test_map_applies_fn_and_keeps_src():
    recs = [{"text": t, "__src__": (0, 0, i, i)} for i, t in enumerate(["a", "bc", "Déf"])]
    out = Map(upper_text).process_many(recs)
    assert out == [{"text": "A", "__src__": (0, 0, 0, 0)}, {"text": "BC", "__src__": (0, 0, 1, 1)},
                   {"text": "DÉF", "__src__": (0, 0, 2, 2)}]
    # an explicit __src__ from fn wins
    out = Map(lambda r: {"text": r["text"], "__src__": "mine"}).process_many(recs[:1])
    assert out == [{"text": "a", "__src__": "mine"}]
    assert Map(upper_text).fingerprint()["fn"].endswith("upper_text")
    assert Map(upper_text, name="up").fingerprint() == {"op": "map", "fn": "up"}


@FAST
@given(st.lists(st.integers(-50, 50), max_size=60))
def test_filter_keeps_exactly_true_records(values):
    recs = [{"v": v, "__src__": (0, 0, i, i)} for i, v in enumerate(values)]
    pred = lambda r: r["v"] % 3 == 0 or r["v"] < -40  # noqa: E731
    out = Filter(pred).process_many(recs)
    expected = []
    for i, v in enumerate(values):
        if v % 3 == 0 or v < -40:
            expected.append({"v": v, "__src__": (0, 0, i, i)})
    assert out == expected


def test_map_missing_field_names_the_record():
    recs = [{"text": "ok", "__src__": (0, 0, 0, 0)}, {"body": "no text", "__src__": (1, 2, 3, 4)}]
    with pytest.raises(RecordError) as ei:
        Map(upper_text).process_many(recs)
    assert ei.value.src == (1, 2, 3, 4)


def test_filter_missing_field_names_the_record():
    recs = [{"text": "ok", "__src__": (0, 0, 0, 0)}, {"body": "no text", "__src__": (1, 2, 3, 4)}]
    with pytest.raises(RecordError) as ei:
        Filter(lambda r: len(r["text"]) > 1).process_many(recs)
    assert ei.value.src == (1, 2, 3, 4)


def test_record_error_src():
    e = RecordError("boom", {"__src__": (1, 2, 3, 4), "x": 1})
    assert e.src == (1, 2, 3, 4) and str(e) == "boom"
    assert RecordError("no record").src is None


# ---------------------------------------------------------------- collate


def test_collate_stacks_equal_shapes_and_lists_ragged():
    rows = [{"input_ids": np.arange(4, dtype=np.int32) + 10 * k, "cu_seqlens": np.array(list(range(k + 2)), np.int32),
             "num_tokens": k, "__src__": [(k, 0)], "m": np.full((2, 3), k, np.uint8)} for k in range(3)]
    b = collate(rows)
    assert isinstance(b["input_ids"], np.ndarray) and b["input_ids"].shape == (3, 4)
    assert b["input_ids"].tolist() == [[0, 1, 2, 3], [10, 11, 12, 13], [20, 21, 22, 23]]
    assert b["input_ids"].dtype == np.int32
    assert b["m"].shape == (3, 2, 3) and b["m"][:, 0, 0].tolist() == [0, 1, 2]
    assert isinstance(b["cu_seqlens"], list)
    assert [c.tolist() for c in b["cu_seqlens"]] == [[0, 1], [0, 1, 2], [0, 1, 2, 3]]
    assert b["num_tokens"] == [0, 1, 2]
    assert b["__src__"] == [[(0, 0)], [(1, 0)], [(2, 0)]]
    # same-length but mixed types stay a list
    mixed = collate([{"a": np.zeros(2)}, {"a": [0, 0]}])
    assert isinstance(mixed["a"], list)
    single = collate([{"a": np.ones(3)}])
    assert single["a"].shape == (1, 3)


def test_collate_arrays_are_writable_and_never_shared_with_a_shared_block():
    """A one-row micro-batch takes its row's own array without a copy (the row is freed once delivered); a view into
    a shared block (the processes transport's stacked column) or read-only memory is copied, so writing into a
    micro-batch never changes another one or the block."""
    own = np.arange(4, dtype=np.int32)
    got = collate([{"a": own}])["a"]
    assert got.shape == (1, 4) and got.flags.writeable and np.shares_memory(got, own)
    block = np.arange(8, dtype=np.int32).reshape(2, 4)  # two rows' arrays in one block
    first = collate([{"a": block[0]}])["a"]
    first[0, 0] = 99
    assert block.tolist() == [[0, 1, 2, 3], [4, 5, 6, 7]] and not np.shares_memory(first, block)
    frozen = np.arange(3)
    frozen.flags.writeable = False
    thawed = collate([{"a": frozen}])["a"]
    assert thawed.flags.writeable and not np.shares_memory(thawed, frozen)
    two = collate([{"a": own}, {"a": own}])["a"]  # several rows: always a new array
    two[0, 0] = -1
    assert own[0] == 0 and two[1, 0] == 0


# ---------------------------------------------------------------- token_corrected_weights


class WordDataset:
    """Fake dataset: document (s, i) has words_of(s, i) words. Records every read."""

    def __init__(self, shard_sizes, words_of):
        self.shard_sizes = list(shard_sizes)
        self.words_of = words_of
        self.reads = []

    def read(self, shard, indices):
        assert 0 <= shard < len(self.shard_sizes)
        out = []
        for i in indices:
            assert 0 <= i < self.shard_sizes[shard]
            self.reads.append((shard, i))
            out.append({"text": " ".join(["w"] * self.words_of(shard, i))})
        return out


def count_words(records):
    return [len(r["text"].split()) for r in records]


def test_token_corrected_weights_exact_means():
    a = WordDataset([3, 0, 5], lambda s, i: 2 + s + i)          # short documents
    b = WordDataset([10, 10], lambda s, i: 40 + 7 * s + i % 4)  # long documents
    c = WordDataset([1], lambda s, i: 5)
    weights = [0.5, 0.3, 0.2]
    got = token_corrected_weights([a, b, c], weights, count_words, seed=3, sample_size=1000)
    means = []
    for ds in (a, b, c):
        lens = [ds.words_of(s, i) for s, size in enumerate(ds.shard_sizes) for i in range(size)]
        means.append(sum(lens) / len(lens))
        # every document read exactly once
        assert sorted(ds.reads) == [(s, i) for s, size in enumerate(ds.shard_sizes) for i in range(size)]
    raw = [w / m for w, m in zip(weights, means)]
    expected = [x / sum(raw) for x in raw]
    assert got == pytest.approx(expected, rel=1e-12)
    assert sum(got) == pytest.approx(1.0)
    # expected token shares equal the targets: share_d = got_d * mean_d / sum(...)
    tok_shares = [g * m for g, m in zip(got, means)]
    assert [x / sum(tok_shares) for x in tok_shares] == pytest.approx(weights, rel=1e-12)


def test_token_corrected_weights_sampled_is_deterministic():
    def make():
        return [WordDataset([50, 30, 0, 20], lambda s, i: 1 + (s * 31 + i * 7) % 13),
                WordDataset([200], lambda s, i: 30 + i % 5)]
    d1, d2 = make(), make()
    w1 = token_corrected_weights(d1, [1, 1], count_words, seed=1, sample_size=16)
    w2 = token_corrected_weights(d2, [1, 1], count_words, seed=1, sample_size=16)
    assert w1 == w2
    assert [sorted(d.reads) for d in d1] == [sorted(d.reads) for d in d2]
    for d in d1:  # sample_size distinct documents read
        assert len(d.reads) == 16 and len(set(d.reads)) == 16
    # the value matches the mean over the documents actually read
    means = [np.mean([d.words_of(s, i) for s, i in d.reads]) for d in d1]
    raw = [1 / m for m in means]
    assert w1 == pytest.approx([x / sum(raw) for x in raw], rel=1e-12)


def test_group_batch_fills_each_group_and_a_carry_resumes_as_if_never_cut():
    """GroupBatch: each emitted batch is one group's rows in arrival order, of that group's size (oracle: a
    plain dict of lists written here); cutting at a sentinel (carry) and resuming a fresh accumulator from the
    held rows gives what the uncut accumulator gives; the lane's end emits the short buckets oldest group first,
    or drops and counts them with drop_last."""
    from zephon.formats.records import SRC, Src
    from zephon.ops import GROUP_ROWS, GroupBatch

    rng = random.Random(3)
    recs = [{"g": rng.choice("abc"), SRC: Src(0, 0, i, i)} for i in range(60)]
    sizes = {"a": 2, "b": 3, "c": 5}
    op = GroupBatch(lambda r: (r["g"], sizes[r["g"]]), key_name="test.key")

    def run(acc, rs):
        return [[r[SRC].position for r in b[GROUP_ROWS]] for x in rs for b in acc.push(x)]

    expect, buckets = [], {}
    for r in recs:
        buckets.setdefault(r["g"], []).append(r[SRC].position)
        if len(buckets[r["g"]]) == sizes[r["g"]]:
            expect.append(buckets.pop(r["g"]))
    whole = op.new_accumulator(0)
    assert run(whole, recs) == expect
    first = op.new_accumulator(0)
    out = run(first, recs[:25])
    emitted, held = first.carry()
    assert emitted == [] and sum(map(len, held)) <= 3 * 4
    again = op.new_accumulator(0)
    again.resume(held)
    assert out + run(again, recs[25:]) == expect
    tail = [[r[SRC].position for r in b[GROUP_ROWS]] for b in again.flush()]
    assert tail == [v for v in buckets.values()] and all(b[SRC] for b in whole.flush())
    dropper = GroupBatch(lambda r: (r["g"], sizes[r["g"]]), key_name="test.key", drop_last=True)
    acc = dropper.new_accumulator(0)
    run(acc, recs)
    assert acc.flush() == [] and dropper.dropped == sum(map(len, buckets.values()))
    small = GroupBatch(lambda r: (r["g"], sizes[r["g"]]), key_name="test.key", max_carry=2).new_accumulator(0)
    run(small, recs[:25])
    short, kept = small.carry()
    assert sum(map(len, kept)) <= 2 and all(len(b[GROUP_ROWS]) < sizes[b[GROUP_ROWS][0]["g"]] for b in short)
    with pytest.raises(RecordError, match="differs"):
        bad = GroupBatch(lambda r: ("a", 2 + r[SRC].position % 2), key_name="k").new_accumulator(0)
        run(bad, recs[:2])
