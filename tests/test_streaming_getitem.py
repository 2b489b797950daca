"""zephon_streaming: a subclass's ``__getitem__`` override shapes every sample, as in Mosaic (llm-foundry's
``StreamingTextDataset`` tokenizes there), and the base ``__getitem__`` reads any sample by its global id.

Oracle: the JSONL files written here (``helpers.write_split_jsonl``: sample k of dataset "a" is line
k % per_shard of shard k // per_shard, so its Mosaic global id is k) and the order of the same dataset without
the override.
"""
from __future__ import annotations

import json
import os

import pytest

torch = pytest.importorskip("torch")

from torch.utils.data import DataLoader  # noqa: E402

from helpers import world, write_split_jsonl  # noqa: E402
from zephon_streaming import StreamingDataLoader, StreamingDataset  # noqa: E402

GBS, SHARDS, PER_SHARD = 8, 3, 20


class Shouting(StreamingDataset):
    """Mosaic-style subclass: calls the base ``__getitem__`` and reshapes the sample."""

    def __init__(self, *, suffix, **kw):
        super().__init__(**kw)
        self.suffix = suffix
        self.asked = []

    def __getitem__(self, idx):
        self.asked.append(idx)
        sample = super().__getitem__(idx)
        return {"idx": idx, "id": sample["id"], "text": sample["text"].upper() + self.suffix}


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return write_split_jsonl(str(tmp_path_factory.mktemp("getitem")), "a", SHARDS, PER_SHARD, 0)


def written(data) -> dict[int, dict]:
    """Every record as written, by id, read from the files here."""
    out = {}
    for s in range(SHARDS):
        with open(os.path.join(data, "train", f"part-{s}.jsonl")) as f:
            for line in f:
                r = json.loads(line)
                out[r["id"]] = r
    return out


def make(cls, data, **kw):
    with world(0, 1):
        return cls(local=data, split="train", batch_size=GBS, shuffle=True, shuffle_seed=5, chunk_size=2, **kw)


def test_base_getitem_reads_any_sample_by_global_id(data):
    ds = make(StreamingDataset, data)
    try:
        recs = written(data)
        assert len(recs) == SHARDS * PER_SHARD == ds.size
        for k in (0, PER_SHARD - 1, PER_SHARD, 2 * PER_SHARD + 7, SHARDS * PER_SHARD - 1):
            assert ds[k] == recs[k]
        with pytest.raises(IndexError, match=rf"sample id {SHARDS * PER_SHARD} out of range \[0, 60\)"):
            ds[SHARDS * PER_SHARD]
    finally:
        ds.close()


@pytest.mark.parametrize("how", ["main", "dataloader-w2", "streaming-loader-w2"])
def test_subclass_getitem_shapes_every_sample_in_zephons_order(data, how):
    plain = make(StreamingDataset, data)
    ds = make(Shouting, data, suffix="!")
    try:
        order = [int(s["id"]) for s in plain]          # the order without the override
        recs = written(data)
        if how == "main":
            got = list(ds)
            assert ds.asked == order, "__getitem__ is called once per sample, with its global id, in order"
        else:
            cls = DataLoader if how == "dataloader-w2" else StreamingDataLoader
            dl = cls(ds, batch_size=GBS, num_workers=2, collate_fn=list)
            got = [s for batch in dl for s in batch]
        assert [s["idx"] for s in got] == order
        assert got == [{"idx": k, "id": k, "text": recs[k]["text"].upper() + "!"} for k in order]
    finally:
        ds.close()
        plain.close()


def test_override_with_zephon_packing_is_refused(data, tmp_path):
    from tokenizers import Tokenizer, models

    tok = Tokenizer(models.WordLevel({"<unk>": 0, "<eos>": 1}, unk_token="<unk>"))
    with pytest.raises(ValueError, match="Shouting overrides __getitem__.*tokenizer= packs several documents"):
        make(Shouting, data, suffix="", tokenizer=tok, epoch_size=64, max_seq_len=8)
