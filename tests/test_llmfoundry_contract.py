"""llm-foundry conformance: its own ``build_text_dataloader`` / ``StreamingTextDataset`` on ``zephon_streaming``
(one swap before importing llmfoundry, docs/streaming.md), in a real ``composer.Trainer`` on CPU.

Rows of compat_matrix/contracts.py proven here: ``llmfoundry.text_dataloader``, ``llmfoundry.trainer_resume``.
Runs in the ``llm-foundry-0.22.0`` column (``python -m compat_matrix run --env llm-foundry-0.22.0``); skipped
where llm-foundry is not installed.

Data: documents of the demo corpus (``zephon.demo_corpus``, built here from the standard library) prefixed with
their sample id, written by mosaicml-streaming's own ``MDSWriter``; the tokenizer is a byte-level BPE trained here
on that corpus with ``tokenizers`` (no Hub download). Oracle: this file tokenizes every document itself exactly as
``StreamingTextDataset._tokenize`` is documented to (truncate and pad to ``max_seq_len``), so every row a batch
holds maps back to one sample id; batches are compared by those ids with an uninterrupted run.
"""
from __future__ import annotations

import importlib.util
import json
import os
from collections import Counter
from pathlib import Path

import pytest

# find_spec, not importorskip: importing llmfoundry here would define StreamingTextDataset before the swap
if importlib.util.find_spec("llmfoundry") is None:
    pytest.skip("llm-foundry not installed: run `python -m compat_matrix run --env llm-foundry-0.22.0`",
                allow_module_level=True)
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import llmfoundry_job as job  # noqa: E402  (makes the swap before llmfoundry is imported)
from composer_launch import launch, steps_side_by_side  # noqa: E402

N = 100     # samples
GBS = 8     # global batch; num_canonical_nodes defaults to it (8 lanes)
JOB = Path(__file__).with_name("llmfoundry_job.py")


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """(MDS directory, tokenizer.json, texts by sample id)."""
    from streaming import MDSWriter

    from zephon.demo_corpus import build_corpus, build_tokenizer

    work = tmp_path_factory.mktemp("llmfoundry_demo")
    dirs = build_corpus(work, limit_bytes=300_000, shards=2)
    tok = build_tokenizer(work, [dirs["docstrings_jsonl"]], vocab_size=1024)
    docs = [json.loads(line)["text"] for f in sorted(Path(dirs["docstrings_jsonl"]).glob("*.jsonl"))
            for line in f.read_text().splitlines()]
    assert len(docs) >= N, f"the demo corpus gave {len(docs)} documents"
    texts = {i: f"sample {i}: {docs[i]}" for i in range(N)}
    out = work / "mds"
    with MDSWriter(out=str(out / "train"), columns={"text": "str"}, compression="zstd", size_limit=4096) as w:
        for i in range(N):
            w.write({"text": texts[i]})
    return str(out), tok, texts


@pytest.fixture(scope="module")
def ids_of(corpus):
    """Row (tuple of input ids) -> sample id, from this file's own tokenization; every row is distinct."""
    _, tok_path, texts = corpus
    tok = job.load_tokenizer(tok_path)
    rows = {tuple(tok(t, truncation=True, padding="max_length", max_length=job.SEQ)["input_ids"]): i
            for i, t in texts.items()}
    assert len(rows) == N, "two samples tokenize alike: the ids could not be told apart"
    return rows


@pytest.fixture(scope="module")
def S(corpus):
    """Global steps per epoch from the shards' own index: one pass, the last global batch filled."""
    index = json.loads((Path(corpus[0]) / "train" / "index.json").read_text())
    assert sum(s["samples"] for s in index["shards"]) == N
    return -(-N // GBS)


def sample_ids(step: dict, ids_of: dict) -> list[int]:
    rows = [tuple(r) for r in step["rows"]]
    unknown = [r for r in rows if r not in ids_of]
    assert not unknown, f"step {step['batch']}: {len(unknown)} rows are no sample's tokenization: {unknown[:1]}"
    return [ids_of[r] for r in rows]


def global_ids(ranks: list[dict], ids_of: dict) -> list[list[int]]:
    """Per step, the sample ids of the ranks' batches concatenated in rank order."""
    return [[x for s in steps for x in sample_ids(s, ids_of)] for steps in steps_side_by_side(ranks)]


@pytest.fixture(scope="module")
def one_rank(corpus):
    """The oracle: one rank in this process, two epochs uninterrupted, DataLoader workers as llm-foundry sets."""
    data, tok, _ = corpus
    return job.run(data, tok, batch_size=GBS, max_duration="2ep", num_workers=2)


@pytest.fixture(scope="module")
def two_ranks(corpus, S, tmp_path_factory):
    """``composer -n 2``: per-device batch GBS/2, two epochs, checkpoints mid-epoch 0 and mid-epoch 1."""
    data, tok, _ = corpus
    tmp = tmp_path_factory.mktemp("llmfoundry_two_ranks")
    ranks = launch(JOB, 2, tmp, "--data", data, "--tokenizer", tok, "--batch-size", str(GBS // 2),
                   "--max-duration", "2ep", "--workers", "1", "--save-folder", str(tmp / "ckpt"),
                   "--save-interval", f"at:{S // 2},{S + S // 2}")
    return ranks, tmp / "ckpt"


@pytest.mark.contract("llmfoundry.text_dataloader")
def test_build_text_dataloader_runs_streaming_text_dataset_on_zephon(S, one_rank, ids_of):
    r = one_rank
    assert r["classes"][:2] == ["llmfoundry.data.text_data.StreamingTextDataset",
                                "zephon_streaming.dataset.StreamingDataset"]
    assert r["world_size"] == 1 and r["dataloader_len"] == S and r["len"] == S * GBS
    assert [(s["epoch"], s["batch_in_epoch"]) for s in r["steps"]] == [(e, k) for e in range(2) for k in range(S)]
    # every row is StreamingTextDataset.__getitem__'s tokenization of one sample: the override is honoured
    epochs = [[i for s in r["steps"] if s["epoch"] == e for i in sample_ids(s, ids_of)] for e in range(2)]
    fill = S * GBS - N
    for ids in epochs:
        assert set(ids) == set(range(N)), "an epoch is one pass over the samples"
        assert sorted(Counter(ids).values()) == [1] * (N - fill) + [2] * fill, "only the last batch is filled"
    assert epochs[0] != epochs[1], "each epoch is reshuffled"


@pytest.mark.contract("llmfoundry.trainer_resume")
def test_two_ranks_give_the_one_rank_global_batches(S, one_rank, two_ranks, ids_of):
    ranks, _ = two_ranks
    assert [(r["rank"], r["world_size"]) for r in ranks] == [(0, 2), (1, 2)]
    assert all(r["len"] == S * GBS // 2 and r["dataloader_len"] == S for r in ranks)
    assert global_ids(ranks, ids_of) == global_ids([one_rank], ids_of)
    assert ranks[0]["weights"] == ranks[1]["weights"]


@pytest.mark.contract("llmfoundry.trainer_resume")
@pytest.mark.parametrize("epoch", [0, 1])
def test_checkpoint_on_two_ranks_resumes_on_one(corpus, S, one_rank, two_ranks, ids_of, tmp_path, epoch):
    data, tok, _ = corpus
    two, ckpt = two_ranks
    k = epoch * S + S // 2
    [r] = launch(JOB, 1, tmp_path, "--data", data, "--tokenizer", tok, "--batch-size", str(GBS),
                 "--max-duration", "2ep", "--workers", "2", "--load-path", str(ckpt / f"ep{epoch}-ba{k}-rank0.pt"))
    assert r["world_size"] == 1 and r["dataset_resumption"] == {"train": True}
    assert [s["batch"] for s in r["steps"]] == list(range(k, 2 * S)), "resumed at the checkpoint's batch"
    uninterrupted = global_ids(two, ids_of)
    assert global_ids([r], ids_of) == uninterrupted[k:], "a resumed batch differs from the uninterrupted run's"
    assert uninterrupted == global_ids([one_rank], ids_of)
