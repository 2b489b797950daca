"""Concatenation packing (``Pack(method="concat")``) against an oracle written here: the lane's documents
concatenated with numpy and cut into windows must give the same rows, carried across flush sentinels by identity
and offset; the stream is pinned by SHA-256. Exactly-once delivery through checkpoints and dp changes is in
tests/test_state_machine.py (by token counts)."""
import hashlib
import json
from itertools import islice

import numpy as np
import pytest

from zephon import Batch, Decode, LoaderPlan, Pack, Tokenize, open_dataset
from zephon.checkpoint import CheckpointError, LaneCursor, merge_states
from zephon.formats.records import OFFSET
from zephon.host import decode_state, encode_state, state_capacity

from helpers import StepHasher, make_loader

LENGTHS = [5, 9, 3, 16, 7, 2, 11, 4, 4, 1, 8, 6, 13, 2, 3, 10, 12, 1, 40, 2]


def _docs(lengths):
    """Document k holds tokens 1000k, 1000k+1, ... (distinct everywhere, so a misplaced token shows)."""
    return [{"input_ids": np.arange(1000 * k, 1000 * k + n, dtype=np.int32), "num_tokens": n,
             "__src__": (0, 0, k, 500 + k), "__piece__": 0} for k, n in enumerate(lengths)]


def _run(acc, docs):
    rows = []
    for d in docs:
        rows.extend(acc.push(d))
    return rows + acc.flush()


def _oracle(lengths, L, shift, pad=0, label_pad=-100):
    """Rows as concatenate-and-cut builds them, written without the accumulator: tokens end to end, windows of L
    (shift: L + 1 tokens, consecutive windows sharing one), positions counting from each document's start or from
    the row's start."""
    tokens = np.concatenate([d["input_ids"] for d in _docs(lengths)])
    doc_of = np.repeat(np.arange(len(lengths)), lengths)
    first = np.r_[True, doc_of[1:] != doc_of[:-1]]  # a document's first token
    rows = []
    for start in range(0, tokens.size, L):
        n = min(L, tokens.size - start)
        ids = np.full(L, pad, np.int32)
        ids[:n] = tokens[start:start + n]
        lab = np.full(L, label_pad, np.int32)
        if shift:
            nxt = tokens[start + 1:start + n + 1]
            lab[:nxt.size] = np.where(first[start + 1:start + 1 + nxt.size], label_pad, nxt)
        else:
            lab[:n] = np.where(first[start:start + n], label_pad, tokens[start:start + n])
        pos = np.zeros(L, np.int32)
        for i in range(1, n):
            pos[i] = 0 if doc_of[start + i] != doc_of[start + i - 1] else pos[i - 1] + 1
        docs_in = list(dict.fromkeys(doc_of[start:start + n].tolist()))
        rows.append((ids, lab, pos, [500 + k for k in docs_in], n))
    return rows


@pytest.mark.parametrize("shift", [False, True])
@pytest.mark.parametrize("L", [1, 7, 16, 64])
def test_concat_rows_equal_concatenate_and_cut(L, shift):
    rng = np.random.default_rng(L)
    lengths = LENGTHS + rng.integers(1, 3 * L, 30).tolist()
    rows = _run(Pack(L, method="concat", shift_labels=shift).new_accumulator(0), _docs(lengths))
    want = _oracle(lengths, L, shift)
    assert len(rows) == len(want) == -(-sum(lengths) // L)
    for r, (ids, lab, pos, srcs, n) in zip(rows, want):
        np.testing.assert_array_equal(r["input_ids"], ids)
        np.testing.assert_array_equal(r["labels"], lab)
        np.testing.assert_array_equal(r["position_ids"], pos)
        assert [p for p, _ in r["__src__"]] == srcs and r["num_tokens"] == n
        assert r["attention_mask"].sum() == n
        cu = r["cu_seqlens"]  # a boundary wherever a position restarts, the row's end last
        assert cu.tolist() == [0, *(np.flatnonzero(pos[1:n] == 0) + 1).tolist(), n]
    assert sum(r["num_tokens"] < L for r in rows) <= 1  # padding only in the last row


@pytest.mark.parametrize("shift", [False, True])
def test_carry_then_resume_continues_the_same_stream(shift):
    """At every cut point: carry, rebuild a fresh accumulator from the held records (what the engine regenerates
    from the refs, ``OFFSET`` included), push the rest: the rows are the uninterrupted ones."""
    docs, L = _docs(LENGTHS), 8
    op = Pack(L, method="concat", shift_labels=shift)
    whole = _run(op.new_accumulator(0), docs)
    for cut in range(len(docs) + 1):
        acc = op.new_accumulator(0)
        rows = [r for d in docs[:cut] for r in acc.push(d)]
        emitted, held = acc.carry()
        assert emitted == [] and len(held) <= 1 and sum(len(b) for b in held) <= op.max_carried()
        refs = [(d["__src__"][3], d.get(OFFSET, 0)) for b in held for d in b]  # what the checkpoint names
        regenerated = [[{**docs[p - 500], **({OFFSET: off} if off else {})} for p, off in refs]] if refs else []
        fresh = op.new_accumulator(0)
        fresh.resume(regenerated)
        rows += _run(fresh, docs[cut:])
        assert len(rows) == len(whole)
        for a, b in zip(rows, whole):
            for k in ("input_ids", "labels", "position_ids", "cu_seqlens"):
                np.testing.assert_array_equal(a[k], b[k])


def _sha(rows) -> str:
    h = hashlib.sha256()
    for r in rows:
        for k in ("input_ids", "labels", "position_ids", "attention_mask", "cu_seqlens"):
            h.update(r[k].dtype.str.encode() + r[k].tobytes())
        h.update(json.dumps([r["num_tokens"], [list(s) for s in r["__src__"]]]).encode())
    return h.hexdigest()


# Computed once (the first version of concat packing) and pinned: a change of the stream must be seen here.
GOLDEN = {False: "ad8314c7b8c55872c7be715b6a35c2a2eb24b0d4ff26b6499791bdbc608dc5ef",
          True: "e61f7253f3c3184813814311a5b0ad5a5067b4d2e0d7534bb2a90c4a3e4ee358"}


@pytest.mark.parametrize("shift", [False, True])
def test_concat_stream_is_pinned(shift):
    rows = _run(Pack(16, method="concat", shift_labels=shift).new_accumulator(0), _docs(LENGTHS))
    assert _sha(rows) == GOLDEN[shift]


def test_bin_packers_keep_their_fingerprint_and_refuse_shift():
    assert "shift_labels" not in Pack(64).fingerprint()
    assert Pack(64, method="concat").fingerprint()["shift_labels"] is False
    with pytest.raises(ValueError, match="shift_labels=True needs method='concat'"):
        Pack(64, shift_labels=True)


def test_checkpoint_names_a_cut_document_by_offset():
    ok = {"lane": 0, "sentinel_chunk": 1, "sentinel_offset": 0, "replay_cursor": 0, "delivered_rows": 3,
          "carry": {"3": [[[7, 0, 5], 9, [11, 2]]]}}
    assert LaneCursor.from_dict(ok).carry == ok["carry"]
    for bad in ([7, 0, 0], [7, -1, 5], [7, 0, 5, 1], []):
        with pytest.raises(CheckpointError, match="malformed"):
            LaneCursor.from_dict({**ok, "carry": {"3": [[bad]]}})


@pytest.fixture(scope="module")
def docs_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("docs")
    (d / "a.jsonl").write_text("".join(json.dumps({"text": f"doc {i}"}) + "\n" for i in range(200)))
    return str(d)


@pytest.mark.parametrize("lanes,L", [(8, 64), (64, 256)])
def test_the_largest_concat_state_fits_the_capacity(docs_dir, tokenizer_path, lanes, L):
    """Every lane carrying a remainder of L - 1 one-token documents at the largest position and piece, the first cut
    at the largest offset (built here): it fits; a remainder of L + 1000 documents does not."""
    plan = LoaderPlan.build([open_dataset(docs_dir)], [Decode(), Tokenize(tokenizer_path, eos_id="<eos>"),
                                                       Pack(L, method="concat"), Batch(1)], canonical_replicas=lanes)
    big, piece = (1 << 62) - 1, (1 << 31) - 1

    def worst(n):
        carry = {"2": [[[big, piece, piece]] + [[big, piece]] * (n - 1)]}
        return plan.make_state([{"lane": lane, "sentinel_chunk": big, "sentinel_offset": big, "replay_cursor": big,
                                 "delivered_rows": big, "carry": carry} for lane in range(lanes)])
    cap = state_capacity(plan)
    assert decode_state(encode_state(worst(L), cap)) == json.loads(json.dumps(worst(L)))
    with pytest.raises(CheckpointError, match="more than the"):
        encode_state(worst(L + 1000), cap)


def test_concat_resumed_on_other_dp_degrees_gives_the_reference_global_batches(corpus, tokenizer_path):
    """Invariant 2 with documents cut across rows and carried across flush sentinels (4 documents per span, each
    about two rows long): dp 1 uninterrupted = dp 2 to step 5, checkpoint (JSON), dp 4 to step 12, step for step."""
    dirs, steps, cut = [corpus["docs_jsonl"], corpus["code_jsonl"]], 12, 5
    kw = dict(canonical_replicas=4, max_length=64, pack_method="concat", chunk_size=8, flush_every_k_chunks=0.5,
              shuffle_buffer=3, micro_batch=1)
    ref = StepHasher()
    for mb in islice(make_loader(dirs, tokenizer_path, **kw), steps * 8):
        ref.add(mb)
    got = StepHasher()
    first = [make_loader(dirs, tokenizer_path, dp=2, rank=r, **kw) for r in range(2)]
    for L in first:
        for mb in islice(L, cut * 4):
            got.add(mb)
    state = json.loads(json.dumps(merge_states([L.checkpoint() for L in first])))
    assert any(isinstance(r, list) and len(r) == 3 for e in state["lanes"] for bins in e.get("carry", {}).values()
               for b in bins for r in b), "no document was carried cut mid-way: the test would not test it"
    for r in range(4):
        L = make_loader(dirs, tokenizer_path, dp=4, rank=r, **kw)
        L.restore(state)
        for mb in islice(L, (steps - cut) * 2):
            got.add(mb)
    assert got.digests() == ref.digests() and len(ref.digests()) == steps
