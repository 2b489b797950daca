"""Real multi-process runs: torch.distributed (gloo) process groups spawned with torch.multiprocessing.

Every global batch (rows gathered on rank 0) is compared with an uninterrupted single-process
reference: the core Loader on one rank (``helpers``) or, for the TorchTitan loop, one uninterrupted
run of the same loop at the same dp degree.
"""
from __future__ import annotations

import os

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("torchdata")

from helpers import reference_digests  # noqa: E402
from torch_jobs import R, loader_job, small_corpus, spawn, titan_job, uneven_tail_job  # noqa: E402

STEPS, K = 7, 3


@pytest.fixture(scope="module")
def dirs(corpus):
    return [corpus["docs_jsonl"], corpus["code_jsonl"]]


@pytest.fixture(scope="module")
def reference(dirs, tokenizer_path):
    return {str(s): d for s, d in reference_digests(dirs, tokenizer_path, STEPS).items()}


def resume_per_rank(spec, tmp, ckpt, saved_dp, world, num_workers, reference, micro_batch=1):
    """Resume the per-rank files in ``ckpt`` (saved at ``saved_dp``) on ``world`` ranks: global batches of steps
    K..STEPS-1 equal the uninterrupted reference, and each new rank read exactly the old ranks whose lanes it owns
    (from the layout: 8 contiguous lanes, new rank r owns [r*8/world, (r+1)*8/world), old rank o held
    [o*8/saved_dp, ...)), at most ceil(saved_dp / world) + 1 of them."""
    out = spawn(loader_job, world, tmp, dict(spec, micro_batch=micro_batch, num_workers=num_workers, stop=STEPS,
                                             load=ckpt))
    assert out["digests"] == {str(s): reference[str(s)] for s in range(K, STEPS)}, (world, num_workers)
    for r, reads in enumerate(out["reads"]):
        lanes = range(r * R // world, (r + 1) * R // world)
        assert reads == sorted({lane * saved_dp // R for lane in lanes}), (world, r, reads)
        assert len(reads) <= -(-saved_dp // world) + 1


def save_per_rank(spec, tmp, world, reference, micro_batch=1, num_workers=2):
    """Run ``world`` ranks to step K, each writing its own ``state_dict()`` file; returns the directory."""
    ckpt = os.path.join(tmp, f"ckpt{world}-{os.urandom(2).hex()}")
    os.makedirs(ckpt)
    first = spawn(loader_job, world, tmp, dict(spec, micro_batch=micro_batch, num_workers=num_workers, stop=K,
                                               save=ckpt))
    assert first["digests"] == {str(s): reference[str(s)] for s in range(K)}
    # each rank's state holds its own lanes only, and saving made no process group beyond the job's
    assert first["state_lanes"] == [list(range(r * R // world, (r + 1) * R // world)) for r in range(world)]
    assert first["groups"] == [1] * world
    assert sorted(os.listdir(ckpt)) == [f"rank-{r}.json" for r in range(world)]
    return ckpt


@pytest.mark.contract("torch.distributed", "torch.stateful")
def test_per_rank_states_on_4_resume_on_2_and_1(dirs, tokenizer_path, reference, tmp_path):
    spec = dict(dirs=dirs, tok=tokenizer_path)
    ckpt = save_per_rank(spec, str(tmp_path), 4, reference)
    for world, nw in ((2, 0), (1, 3)):
        resume_per_rank(spec, str(tmp_path), ckpt, 4, world, nw, reference)


@pytest.mark.slow
@pytest.mark.contract("torch.distributed", "torch.stateful")
def test_per_rank_states_on_4_resume_on_8(dirs, tokenizer_path, reference, tmp_path):
    """8 gloo ranks: each reads the one old rank that held its lane."""
    spec = dict(dirs=dirs, tok=tokenizer_path)
    ckpt = save_per_rank(spec, str(tmp_path), 4, reference)
    resume_per_rank(spec, str(tmp_path), ckpt, 4, 8, 0, reference)


@pytest.mark.contract("torch.distributed", "torch.stateful")
def test_per_rank_states_on_2_resume_on_4(dirs, tokenizer_path, reference, tmp_path):
    spec = dict(dirs=dirs, tok=tokenizer_path)
    ckpt = save_per_rank(spec, str(tmp_path), 2, reference, micro_batch=2, num_workers=0)
    resume_per_rank(spec, str(tmp_path), ckpt, 2, 4, 1, reference)


@pytest.mark.contract("torch.finite")
def test_finite_stream_every_rank_stops_at_the_same_step(corpus, tokenizer_path, tmp_path):
    """exhaustion="stop" on 2 ranks x 2 workers: ranks agree on the last complete step (no rank left
    waiting in a collective), and the steps equal one uninterrupted single-process run's."""
    small = small_corpus(corpus, tmp_path)
    ref = {str(s): d for s, d in reference_digests(small, tokenizer_path, exhaustion="stop").items()}
    out = spawn(loader_job, 2, str(tmp_path), dict(dirs=small, tok=tokenizer_path, micro_batch=1, num_workers=2,
                                                   stop=10_000, exhaustion="stop"))
    assert out["digests"] == ref


@pytest.mark.contract("torch.finite")
def test_finite_pass_without_drop_last_gives_every_rank_the_same_steps(tmp_path):
    """drop_last=False, ranks holding different row counts (1000 rows, about 30% filtered out, 4 lanes of
    16-row chunks): in a loop with a collective per batch no rank is left waiting, every rank runs the same
    number of full batches (padding rows where a rank ran out), and every kept input row is delivered exactly
    once, none dropped (the oracle: the rows the test wrote and its own count of the filter)."""
    from torch_jobs import keep_row

    n = 1000
    d = tmp_path / "text"
    d.mkdir()
    (d / "rows.jsonl").write_text("".join(f'{{"text": "row {i}"}}\n' for i in range(n)))
    kept = {f"row {i}" for i in range(n) if keep_row({"text": f"row {i}"})}
    assert 600 < len(kept) < 800
    for nw in (0, 2):
        per_rank = spawn(uneven_tail_job, 2, str(tmp_path), dict(dir=str(d), chunk_size=16, num_workers=nw))
        assert per_rank[0]["batches"] == per_rank[1]["batches"], nw
        assert all(r["rows"] == [2] for r in per_rank), nw  # 2 lanes x 1 row in every batch, padded or not
        delivered = [t for r in per_rank for t in r["texts"]]
        assert len(delivered) == len(set(delivered)) and set(delivered) == kept, nw
        assert all(r["dropped_rows"] == 0 for r in per_rank), nw
        # every batch holds 2 rows on each of the 2 ranks: what is not a kept row is padding
        assert sum(r["padding"] for r in per_rank) == 2 * 2 * per_rank[0]["batches"] - len(kept) > 0, nw


@pytest.fixture(scope="module")
def titan_dcp4(corpus, tokenizer_path, tmp_path_factory):
    """TorchTitan-shaped runs at dp=4: uninterrupted to step 6, and checkpointed at step 3 (DCP: model +
    optimizer + data loader, the loader as TorchTitan's ``dp_rank_{r}`` / ``world_size`` entries)."""
    pytest.importorskip("torchtitan.components.dataloader",
                        reason="torchtitan not installed: the TorchTitan rows need its BaseDataLoader")
    from torch.distributed.checkpoint import FileSystemReader

    tmp = str(tmp_path_factory.mktemp("titan_dcp4"))
    spec = dict(path=f"{corpus['docs_jsonl']},{corpus['code_jsonl']}", tok=tokenizer_path)
    full = spawn(titan_job, 4, tmp, dict(spec, num_workers=0, steps=6))
    ck = os.path.join(tmp, "dcp")
    head = spawn(titan_job, 4, tmp, dict(spec, num_workers=1, steps=3, ckpt_save=ck))
    assert head["losses"] == {s: full["losses"][s] for s in ("0", "1", "2")}
    meta = FileSystemReader(ck).read_metadata().state_dict_metadata
    saved = {k: m.size.numel() for k, m in meta.items() if k.startswith("dataloader.")}
    assert sorted(saved) == [f"dataloader.dp_rank_{r}" for r in range(4)] + ["dataloader.world_size"]
    return dict(spec=spec, tmp=tmp, full=full, ck=ck, saved=saved)


def resume_reading_only_needed_entries(run, world, num_workers):
    """Resume ``run`` (``titan_dcp4``) at dp ``world``: the global batches of steps 3-5 equal the
    uninterrupted run's, and each new rank read from storage exactly the entries of the old ranks holding its
    lanes (counted below DCP: contiguous, 8 lanes on 4 old ranks, new rank r owns lanes [r*8/world,
    (r+1)*8/world)), at most ceil(4 / world) + 1 of them. Returns rank 0's output."""
    out = spawn(titan_job, world, run["tmp"], dict(run["spec"], num_workers=num_workers, steps=6,
                                                   ckpt_load=run["ck"]))
    assert out["digests"] == {s: run["full"]["digests"][s] for s in ("3", "4", "5")}, world
    for rank, reads in enumerate(out["reads"]):
        lanes = range(rank * R // world, (rank + 1) * R // world)
        want = sorted({f"dataloader.dp_rank_{lane // 2}" for lane in lanes})
        got = sorted(k for k, _ in reads if k.startswith("dataloader.dp_rank_"))
        assert got == want and len(got) <= -(-4 // world) + 1, (world, rank, got)
    return out


@pytest.mark.contract("torchtitan.dcp_resume")
def test_torchtitan_loop_dcp_resume(titan_dcp4):
    """dp=4 checkpoint resumed at dp=4 (identical losses, exactly: model, optimizer and loader) and at dp=2
    (identical global batches, each rank reading 2 of the 4 saved entries)."""
    run = titan_dcp4
    same = resume_reading_only_needed_entries(run, 4, 0)
    assert same["losses"] == {s: run["full"]["losses"][s] for s in ("3", "4", "5")}  # exact float equality
    resume_reading_only_needed_entries(run, 2, 1)


@pytest.mark.slow
@pytest.mark.contract("torchtitan.dcp_resume")
def test_torchtitan_loop_dcp_resume_at_dp8(titan_dcp4):
    """The same dp=4 checkpoint resumed on 8 gloo ranks: each reads 1 of the 4 saved entries."""
    resume_reading_only_needed_entries(titan_dcp4, 8, 0)
