"""Work sized to demand (issue 32): the first global batch, cold or after a restore, reads about what it consumes,
not a unit per lane; and how pointers are cut into units never changes the stream."""
from __future__ import annotations

import pytest

from zephon.formats import open_dataset
from zephon.ops import Batch, Decode, Pack, Tokenize

from helpers import CountingReads, StepHasher, make_loader, one_row_loader, run_steps, write_one_line_docs

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


@pytest.fixture(scope="module")
def short_docs(tmp_path_factory):
    """4,000 one-line documents (one row each: no packing), in 4 JSONL shards."""
    return write_one_line_docs(tmp_path_factory.mktemp("short_docs"), 4000, 4)


def _loader(root, tokenizer_path, runner):
    return one_row_loader(root, tokenizer_path, runner, canonical_replicas=LANES, global_batch_size=LANES * ROWS,
                          chunk_size=64)


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


def test_torch_dataloader_workers_read_what_the_first_global_batch_consumes(short_docs, tokenizer_path):
    """zephon_torch with 2 DataLoader worker processes: each worker runs its lanes through the core, so the first
    global batch (one DataLoader batch: every lane's ROWS rows) is read once, not a unit per lane (a 64-pointer unit
    per lane is every document here); counted across the worker processes in shared memory. A worker's item is its
    lanes' share of one (step, micro) (``zephon.host.workers.bundled``), and torch keeps ``prefetch_factor`` more
    items per worker in flight: those are the user's read-ahead, a local micro-batch per prefetch_factor."""
    import multiprocessing

    import zephon_torch

    ds = open_dataset(short_docs)
    reads = multiprocessing.get_context("fork").Value("l", 0)
    inner = ds.read

    def read(shard, idx):  # runs in the forked workers
        with reads.get_lock():
            reads.value += len(idx)
        return inner(shard, idx)
    ds.read = read
    # one open bin: a row is out as soon as the next document does not fit (what a row needs is what it holds + 1)
    ops = [Decode("text"), Tokenize(tokenizer_path, eos_id="<eos>", max_length=64), Pack(64, max_open_bins=1),
           Batch(ROWS)]
    data = zephon_torch.ZephonIterableDataset([ds], ops, canonical_replicas=LANES, global_batch_size=LANES * ROWS,
                                              chunk_size=64, runner="inline", worker_runner="inline", seed=0)
    prefetch_factor = 1
    dl = zephon_torch.DataLoader(data, num_workers=2, multiprocessing_context="fork", prefetch_factor=prefetch_factor)
    it = iter(dl)
    mb = next(it)  # the rank's micro-batches of one (step, micro), all lanes: here the whole first global batch
    assert len(mb["input_ids"]) == LANES * ROWS
    docs = int(((mb["position_ids"] == 0) & (mb["attention_mask"] == 1)).sum())  # documents in its rows
    seen = reads.value
    del it, dl
    # the core reads at most twice what a row consumes (test above), for the batch and the items in flight
    bound = 2 * (docs + LANES) * (1 + prefetch_factor)
    assert seen <= bound, f"the workers read {seen} documents before a first global batch of {docs} (bound {bound})"


def test_step_assembly_streams_items_in_rank_order_before_groups_complete():
    """Items of 3 lanes arriving interleaved as two workers would give them: ``stream`` hands out exactly the
    (step, micro, lane) order (sorted here), and lane 0's item before lane 2 delivered its part of the group."""
    from zephon.checkpoint import LaneCursor
    from zephon.host.assembly import StepAssembly

    asm = StepAssembly([0, 1, 2], [LaneCursor.fresh(lane) for lane in range(3)], 2, 1)
    arrivals = [(0, 0, 0), (0, 0, 2), (0, 1, 0), (0, 1, 2), (0, 0, 1), (0, 1, 1), (1, 0, 0), (1, 0, 1), (1, 0, 2)]
    out, first = [], None
    for step, micro, lane in arrivals:
        out += asm.stream(step, micro, lane, (step, micro, lane))
        if first is None and out:
            first = len(out)
    for group in asm.finish():
        out += group
    assert out == sorted(arrivals)
    assert first == 1  # lane 0's item came out on arrival
