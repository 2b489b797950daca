"""``Loader.metrics()`` per-dataset samples and tokens count what was delivered, at any point of a pass and across a
checkpoint and a restore (at another dp degree too), never the read-ahead.

Oracle, made here from the delivered token ids and the JSONL inputs: the two datasets' texts use disjoint bytes (the
byte tokenizer's token is the byte + 3, EOS is 2), each document starts with its dataset's marker byte (``W`` or
``C``, found nowhere else), so a delivered token belongs to the dataset of its byte, an EOS to the document before it
in its lane (concat packing cuts documents across a lane's consecutive rows), and a delivered marker is a delivered
document. Over the whole pass the counts are each file's documents and UTF-8 bytes plus one EOS each.
"""
import copy
import json

import numpy as np
import pytest

from zephon import Batch, Decode, Loader, Pack, Shuffle, Tokenize, merge_states, open_dataset

EOS, OFFSET = 2, 3  # the byte tokenizer: ids 0-2 special, byte b is token b + 3
WEB = b"Wabcdefghijklmnopqrstuvwxyz "
CODE = b"C0123456789_=+"
L = 24


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    root = tmp_path_factory.mktemp("delivered")
    rng = np.random.default_rng(7)
    texts = {}
    for name, alphabet, n in (("web", WEB, 37), ("code", CODE, 29)):
        body = alphabet[1:]
        texts[name] = [chr(alphabet[0]) + bytes(rng.choice(list(body), int(rng.integers(3, 40))).tolist()).decode()
                       for _ in range(n)]
        (root / name).mkdir()
        (root / name / "a.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in texts[name]))
    return root, texts


def make(corpus, method, *, dp_degree=1, dp_rank=0, shuffle_rows=False, runner="threads"):
    root, texts = corpus
    datasets = [open_dataset(str(root / name)) for name in texts]
    split = None if method == "concat" else L  # bin packers need documents cut to the row length
    ops = [Decode(), Tokenize("bytes", eos_id=EOS, max_length=split), Pack(L, method=method)]
    ops += [Shuffle(4)] if shuffle_rows else []
    return Loader(datasets, ops + [Batch(2, drop_last=False)], weights=[37, 29], canonical_replicas=4,
                  global_batch_size=8, chunk_size=8, exhaustion="stop", runner=runner, num_workers=2,
                  dp_degree=dp_degree, dp_rank=dp_rank)


class Oracle:
    """Per dataset, documents (markers) and tokens in the delivered micro-batches, attributing each EOS to the
    dataset of the token before it in its lane (carried across micro-batches: give one Oracle the lane's stream)."""

    def __init__(self):
        self.last = {}  # lane -> dataset of its last delivered token

    def count(self, mbs) -> dict:
        got = {"web": [0, 0], "code": [0, 0]}
        for mb in mbs:
            real = len(mb["input_ids"]) - mb.get("__pad__", 0)
            for ids, mask in zip(mb["input_ids"][:real], mb["attention_mask"][:real]):
                for t in ids[mask == 1].tolist():
                    if t == EOS:
                        name = self.last[mb["__lane__"]]
                    else:
                        name = "web" if t - OFFSET in WEB else "code"
                        assert (t - OFFSET in WEB) != (t - OFFSET in CODE)
                        got[name][0] += t - OFFSET in b"WC"
                    got[name][1] += 1
                    self.last[mb["__lane__"]] = name
        return got


def counted(loader) -> dict:
    return {name: [d["samples"], d["tokens"]] for name, d in loader.metrics()["datasets"].items()}


def whole_pass(texts) -> dict:
    return {name: [len(ts), sum(len(t.encode()) + 1 for t in ts)] for name, ts in texts.items()}


@pytest.mark.parametrize("method,shuffle_rows", [("concat", False), ("best_fit", True)])
def test_counts_are_what_was_delivered_mid_pass_and_across_a_restore_at_another_dp(corpus, method, shuffle_rows):
    _, texts = corpus
    oracle = Oracle()
    a = make(corpus, method, shuffle_rows=shuffle_rows)
    it, mbs = iter(a), []
    for _ in range(7):  # stop mid-step and mid-pass; check after every micro-batch
        mbs.append(next(it))
        assert counted(a) == Oracle().count(mbs)
    before = oracle.count(mbs)
    assert counted(a) == before
    assert 0 < sum(n for n, _ in before.values()) < sum(len(t) for t in texts.values())  # mid-pass indeed
    state = a.checkpoint()
    a.close()
    rest = []
    resumed = {"web": [0, 0], "code": [0, 0]}
    for rank in range(2):  # resumed on two ranks: each counts what it delivered, nothing replayed
        b = make(corpus, method, dp_degree=2, dp_rank=rank, shuffle_rows=shuffle_rows)
        b.restore(merge_states([state]))
        assert counted(b) == {"web": [0, 0], "code": [0, 0]}
        out = list(b)
        rest += out
        assert counted(b) == copy.deepcopy(oracle).count(out)  # the ranks own different lanes
        for name, (n, t) in counted(b).items():
            resumed[name][0] += n
            resumed[name][1] += t
    # the lanes' streams continue across the restore: a document cut there is counted once, where it starts
    assert resumed == oracle.count(rest)
    total = {name: [before[name][0] + resumed[name][0], before[name][1] + resumed[name][1]] for name in texts}
    assert total == whole_pass(texts)


def test_the_counts_do_not_run_ahead_of_the_rows(corpus):
    """Right after the first micro-batch the workers have read far ahead; the counts are that micro-batch's."""
    loader = make(corpus, "concat")
    it = iter(loader)
    mb = next(it)
    m = loader.metrics()
    assert sum(d["tokens"] for d in m["datasets"].values()) == int(mb["attention_mask"].sum()) == m["tokens"]
    assert m["units"] > 1
    loader.close()


def test_ranks_sharing_a_lane_count_their_own_block(corpus):
    _, texts = corpus

    def loader(dp, rank):
        root, _ = corpus
        datasets = [open_dataset(str(root / name)) for name in texts]
        return Loader(datasets, [Decode(), Tokenize("bytes", eos_id=EOS), Pack(L, method="concat"),
                                 Batch(1, drop_last=False)], weights=[37, 29], canonical_replicas=2,
                      global_batch_size=4, chunk_size=8, exhaustion="stop", runner="inline",
                      dp_degree=dp, dp_rank=rank)
    sums, rows = {"web": [0, 0], "code": [0, 0]}, 0
    for rank in range(4):  # two ranks per lane
        ld = loader(4, rank)
        out = list(ld)
        rows += ld.metrics()["rows"]
        assert ld.metrics()["rows"] == sum(len(mb["input_ids"]) - mb.get("__pad__", 0) for mb in out)
        for name, (n, t) in counted(ld).items():
            sums[name][0] += n
            sums[name][1] += t
    assert sums == whole_pass(texts)
