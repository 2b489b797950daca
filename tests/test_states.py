"""A checkpoint as a fixed-size byte buffer (TorchTitan's DCP): the capacity fits the largest state a config
can write, carried documents included."""
import json

import pytest

from zephon import Batch, Decode, LoaderPlan, Pack, Tokenize, open_dataset
from zephon.checkpoint import CheckpointError
from zephon.host import decode_state, encode_state, state_capacity


@pytest.fixture(scope="module")
def docs(tmp_path_factory):
    d = tmp_path_factory.mktemp("docs")
    (d / "a.jsonl").write_text("".join(json.dumps({"text": f"doc {i}"}) + "\n" for i in range(200)))
    return str(d)


def _worst_state(plan, carried: int) -> dict:
    """Every lane at the largest counters, carrying ``carried`` documents each in a bin of its own at the
    largest position and piece a checkpoint accepts (built here, not by the code under test)."""
    big, piece = (1 << 62) - 1, (1 << 31) - 1
    lanes = [{"lane": lane, "sentinel_chunk": big, "sentinel_offset": big, "replay_cursor": big,
              "delivered_rows": big, "carry": {"1": [[[big, piece]] for _ in range(carried)]}}
             for lane in range(plan.canonical_replicas)]
    return plan.make_state(lanes)


@pytest.mark.parametrize("lanes,max_carry", [(8, 64), (64, 64), (64, 200)])
def test_the_largest_state_with_carried_documents_fits_the_capacity(docs, tokenizer_path, lanes, max_carry):
    plan = LoaderPlan.build([open_dataset(docs)], [Decode(), Tokenize(tokenizer_path, eos_id="<eos>", max_length=64),
                                                   Pack(64, max_carry=max_carry), Batch(1)], canonical_replicas=lanes)
    state = _worst_state(plan, max_carry)
    cap = state_capacity(plan)
    raw = encode_state(state, cap)
    assert len(raw) == cap and cap & (cap - 1) == 0 and cap >= 1 << 16
    assert decode_state(raw) == json.loads(json.dumps(state))
    with pytest.raises(CheckpointError, match="more than the"):
        encode_state(_worst_state(plan, max_carry + 1000), cap)
