"""Invariant 5: every source record is delivered exactly once per pass, across any number of
checkpoint/resume cycles at random cut points (even mid-step, even different per rank) and random
dp degrees. The oracle is independent: the document count and each document's piece count come from
reading the JSONL files with ``json`` and tokenizing with ``tokenizers`` directly."""
from __future__ import annotations

import glob
import json
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tokenizers import Tokenizer

from zephon.checkpoint import merge_states

from helpers import make_loader

R, MAX_LEN = 4, 64


def _expected_pieces(corpus_dir, tokenizer_path) -> list[int]:
    tok = Tokenizer.from_file(tokenizer_path)
    texts = []
    for f in sorted(glob.glob(f"{corpus_dir}/*.jsonl")):
        with open(f) as fh:
            texts += [json.loads(line)["text"] for line in fh if line.strip()]
    return sorted(math.ceil((len(e.ids) + 1) / MAX_LEN)  # +1: the EOS token
                  for e in tok.encode_batch(texts, add_special_tokens=False))


def _deliver(segments, corpus_dir, tokenizer_path):
    """Run the segments [(dp, [micro-batches to pull per rank])...], then a final dp to the end."""
    delivered = []
    state = None
    *cuts, final_dp = segments
    for dp, pulls in cuts + [(final_dp, None)]:
        loaders = [make_loader([corpus_dir], tokenizer_path, dp=dp, rank=r, canonical_replicas=R, max_length=MAX_LEN,
                               exhaustion="stop", drop_last=False, chunk_size=16, flush_every_k_chunks=2,
                               shuffle_buffer=3, global_batch_size=2 * R, micro_batch=1, unit_size=8)
                   for r in range(dp)]
        for r, L in enumerate(loaders):
            if state is not None:
                L.restore(state)
            it = iter(L)
            n = None if pulls is None else pulls[r % len(pulls)]
            for k, mb in enumerate(it):
                for srcs in mb["__src__"]:
                    delivered.extend(srcs)
                if n is not None and k + 1 >= n:
                    break
            it.close()
        state = json.loads(json.dumps(merge_states([L.checkpoint() for L in loaders])))
    return delivered


segment = st.tuples(st.sampled_from([1, 2, 4]), st.lists(st.integers(0, 40), min_size=1, max_size=4))


@pytest.mark.slow  # covered: test_state_machine's exactly-once under interrupts, restores and dp changes
@settings(max_examples=8, deadline=None, database=None)
@given(cuts=st.lists(segment, min_size=1, max_size=3), final_dp=st.sampled_from([1, 2, 4]))
def test_every_sample_delivered_exactly_once(corpus, tokenizer_path, cuts, final_dp):
    corpus_dir = corpus["code_jsonl"]
    expected = _expected_pieces(corpus_dir, tokenizer_path)
    delivered = _deliver(cuts + [final_dp], corpus_dir, tokenizer_path)
    assert len(delivered) == len(set(delivered)), "a (sample, piece) was delivered twice"
    pieces = {}
    for position, piece in delivered:
        pieces.setdefault(position, set()).add(piece)
    assert sorted(pieces) == list(range(len(expected))), "a sample was lost"
    assert all(p == set(range(len(p))) for p in pieces.values()), "a piece of a document was lost"
    assert sorted(len(p) for p in pieces.values()) == expected
