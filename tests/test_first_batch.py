"""Work sized to demand (issue 32): the first global batch, cold or after a restore, reads about what it consumes,
not a unit per lane; and how pointers are cut into units never changes the stream."""
from __future__ import annotations

import json

import pytest

from zephon.engine import Loader
from zephon.formats import open_dataset
from zephon.ops import Batch, Decode, Tokenize

from helpers import StepHasher, make_loader, run_steps

LANES, ROWS = 64, 2  # rows per lane step


@pytest.mark.parametrize("unit", [1, 7, 256])
def test_unit_size_never_changes_the_stream(corpus, tokenizer_path, unit):
    """Unit sizes 1, 7 and 256, cold and restored across unit sizes, against the uninterrupted default run."""
    dirs = [corpus["docs_jsonl"], corpus["code_jsonl"]]
    ref = StepHasher()
    run_steps([make_loader(dirs, tokenizer_path, runner="threads")], 8, ref)
    cold = StepHasher()
    run_steps([make_loader(dirs, tokenizer_path, runner="threads", unit_size=unit)], 8, cold)
    assert cold.digests() == ref.digests()
    resumed = StepHasher()
    first = make_loader(dirs, tokenizer_path, unit_size=unit)
    run_steps([first], 3, resumed)
    second = make_loader(dirs, tokenizer_path, runner="threads", unit_size=1 if unit != 1 else 256)
    second.restore(first.checkpoint())
    run_steps([second], 5, resumed)
    assert resumed.digests() == ref.digests()


class CountingReads:
    """Counts the samples a dataset's ``read`` hands to the workers (the test's own count)."""

    def __init__(self, ds):
        self.n, inner = 0, ds.read

        def read(shard, idx):
            self.n += len(idx)
            return inner(shard, idx)
        ds.read = read


@pytest.fixture(scope="module")
def short_docs(tmp_path_factory):
    """4,000 one-line documents (one row each: no packing), in 4 JSONL shards."""
    root = tmp_path_factory.mktemp("short_docs")
    for s in range(4):
        with open(root / f"part-{s}.jsonl", "w") as fh:
            for i in range(s, 4000, 4):
                fh.write(json.dumps({"text": f"document {i} says hello"}) + "\n")
    return str(root)


def _loader(root, tokenizer_path, runner):
    ds = open_dataset(root)
    ops = [Decode("text"), Tokenize(tokenizer_path, eos_id="<eos>", max_length=64), Batch(1)]
    return ds, Loader([ds], ops, canonical_replicas=LANES, global_batch_size=LANES * ROWS, chunk_size=64,
                      runner=runner, num_workers=2)


@pytest.mark.parametrize("runner", ["inline", "threads"])
def test_first_global_batch_reads_at_most_twice_what_it_consumes(short_docs, tokenizer_path, runner):
    """One document per row, so the first global batch consumes LANES * ROWS documents; before it is yielded the
    workers read at most twice that (they read a unit of up to 64 pointers per lane before)."""
    ds, loader = _loader(short_docs, tokenizer_path, runner)
    reads = CountingReads(ds)
    it = iter(loader)
    rows = sum(len(next(it)["input_ids"]) for _ in range(LANES * ROWS))  # micro-batches of one row
    assert rows == LANES * ROWS
    assert reads.n <= 2 * rows, f"read {reads.n} documents before a first global batch of {rows}"
    loader.close()


def test_after_a_restore_reads_what_the_next_step_and_the_replay_need(short_docs, tokenizer_path):
    """Restored after 3 steps (6 rows into each lane's 64-pointer flush span): each lane replays those 6 rows and
    makes its next 2; reads before the first global batch stay within twice that."""
    _, warm = _loader(short_docs, tokenizer_path, "inline")
    it = iter(warm)
    for _ in range(3 * LANES * ROWS):
        next(it)
    state = warm.checkpoint()
    warm.close()
    ds, loader = _loader(short_docs, tokenizer_path, "threads")
    loader.restore(state)
    reads = CountingReads(ds)
    it = iter(loader)
    for _ in range(LANES * ROWS):
        next(it)
    assert reads.n <= 2 * LANES * (3 * ROWS + ROWS), f"read {reads.n} documents before the first global batch"
    loader.close()
