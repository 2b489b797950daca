"""``Loader.restore(state, skip_steps=[...])`` with several ranges, checked against an uninterrupted Loader: the
ranges count steps as the resumed run's training does (each range after the lower ones are left out), their order
is irrelevant, duplicates and overlaps merge, and the checkpoint stores the stream steps removed (sorted, merged)
so a further resume keeps exactly them."""
from __future__ import annotations

import json

import pytest

from helpers import StepHasher, make_loader, run_steps
from zephon.checkpoint import merge_states

KW = dict(canonical_replicas=4, global_batch_size=8, shuffle_buffer=8, micro_batch=2)


@pytest.fixture(scope="module")
def dirs(corpus):
    return [corpus["docs_jsonl"], corpus["code_jsonl"]]


def run(dirs, tok, dp, steps, state=None, skip=None):
    loaders = [make_loader(dirs, tok, dp=dp, rank=r, **KW) for r in range(dp)]
    for L in loaders if state is not None else ():
        L.restore(state, skip_steps=skip)
    h = StepHasher()
    run_steps(loaders, steps, h)
    return h.digests(), json.loads(json.dumps(merge_states([L.checkpoint() for L in loaders])))


@pytest.fixture(scope="module")
def ref_and_state(dirs, tokenizer_path):
    ref, _ = run(dirs, tokenizer_path, 1, 50)
    _, state = run(dirs, tokenizer_path, 2, 30)
    return ref, state


@pytest.mark.parametrize("skip, stream, stored", [
    # training steps 30..41 deliver these uninterrupted steps (the later range counts after the earlier skip)
    ([(32, 34), (38, 40)], [30, 31, 34, 35, 36, 37, 38, 39, 42, 43, 44, 45], [[32, 34], [40, 42]]),
    ([(38, 40), (32, 34)], [30, 31, 34, 35, 36, 37, 38, 39, 42, 43, 44, 45], [[32, 34], [40, 42]]),
    ([(32, 34), (32, 34)], [30, 31, 34, 35, 36, 37, 38, 39, 40, 41, 42, 43], [[32, 34]]),
    ([(34, 38), (32, 36)], [30, 31, 38, 39, 40, 41, 42, 43, 44, 45, 46, 47], [[32, 38]]),
])
def test_several_ranges_skip_what_training_counts(dirs, tokenizer_path, ref_and_state, skip, stream, stored):
    ref, state = ref_and_state
    got, after = run(dirs, tokenizer_path, 2, 10, state, skip)
    assert after["config"]["skips"] == stored
    more, _ = run(dirs, tokenizer_path, 4, 2, after)  # a further resume at another dp keeps exactly these
    got.update(more)
    assert [got[t] for t in range(30, 42)] == [ref[s] for s in stream]
