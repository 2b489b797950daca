"""The host adapters and ``zephon verify`` on data in a bucket (moto's S3 server, tests/s3_server.py).

Oracles: mosaicml-streaming's own StreamingDataset reading the same bucket from the same server; Zephon on the
local copy of the same data (the cache may change speed only, never the order); the uninterrupted run for
resumes.
"""
from __future__ import annotations

import os

import pytest

torch = pytest.importorskip("torch")

from torch.utils.data import DataLoader  # noqa: E402

from s3_server import BUCKET  # noqa: E402
from test_remote_formats import write_mds  # noqa: E402
from test_streaming_adapter import GBS, digest, gather_states, make, take_steps  # noqa: E402


@pytest.fixture(scope="module")
def mds_zstd(tmp_path_factory):
    pytest.importorskip("streaming")
    return write_mds(tmp_path_factory.mktemp("hosts") / "mds", n=256, compression="zstd")


def _rows(ds):
    return [(int(s["id"]), s["text"]) for s in ds]


@pytest.mark.contract("streaming.mds_format")
def test_streaming_remote_with_empty_local_equals_mosaic_on_the_same_bucket(s3, mds_zstd, tmp_path):
    from streaming import StreamingDataset as MosaicDataset

    url = s3.upload_dir(mds_zstd, "mds")
    agg = str(tmp_path / "agg")
    ours = make({"a": None, "agg": agg}, remote=url, local=str(tmp_path / "zl"), split=None, validate_hash="sha1")
    got = _rows(ours)
    mosaic = MosaicDataset(remote=url, local=str(tmp_path / "ml"), batch_size=1, shuffle=False)
    want = [(int(s["id"]), s["text"]) for s in mosaic]
    assert len(want) == 256 and len(got) == len(ours)
    assert set(got) <= set(want) and len(set(got)) == len(got)  # one pass, whole global batches
    # the order is the local copy's: the cache changes speed only
    local = make({"a": mds_zstd, "agg": agg}, split=None)
    assert got == _rows(local)


@pytest.mark.contract("streaming.elastic")
def test_streaming_remote_checkpoint_at_world_4_resumes_at_2_and_8_on_a_cold_cache(s3, mds_zstd, tmp_path):
    url = s3.upload_dir(mds_zstd, "mds")
    agg = str(tmp_path / "agg")

    def remote(rank, size, cache, **kw):
        return make({"a": None, "agg": agg}, rank, size, remote=url, local=str(tmp_path / cache), split=None, **kw)

    ref = remote(0, 1, "ref")
    rows = _rows(ref)
    oracle = [digest(rows[i:i + GBS]) for i in range(0, len(rows), GBS)]
    dsets = [remote(r, 4, "w4", run_id="r4") for r in range(4)]
    its = [iter(DataLoader(d, batch_size=d.batch_size)) for d in dsets]
    assert take_steps(its, 5) == oracle[:5]
    state = gather_states(dsets, 5 * GBS)
    for world in (2, 8):
        resumed = [remote(r, world, f"cold{world}") for r in range(world)]  # a new, empty cache
        for d in resumed:
            d.load_state_dict(state)
        rest = take_steps([iter(DataLoader(d, batch_size=d.batch_size)) for d in resumed], None)
        assert rest == oracle[5:], world


@pytest.mark.contract("energon.format")
def test_energon_adapter_on_s3_equals_local_and_restores_exactly(s3, tmp_path):
    pytest.importorskip("megatron.energon")
    from test_energon_adapter import take, train_loader
    import energon_data as E

    root, _ = E.text_dataset(str(tmp_path / "e"))
    url = s3.upload_dir(root, "text")
    ref = take(train_loader(root), 30)
    assert take(train_loader(url), 30) == ref
    dl = train_loader(url, workers=1)
    head = take(dl, 9)
    state = dl.save_state_rank()
    dl.close()
    resumed = train_loader(url)
    resumed.restore_state_rank(state)
    assert head + take(resumed, 21) == ref


def test_verify_on_a_bucket_passes(s3, corpus, tokenizer_path, tmp_path, capsys):
    import shutil

    import zstandard

    from zephon.cli import main
    src = os.path.join(corpus["docs_jsonl"], "part-0.jsonl")
    z = tmp_path / "a.jsonl.zst"
    z.write_bytes(zstandard.ZstdCompressor().compress(open(src, "rb").read()))
    s3.upload_file(str(z), "v/a.jsonl.zst")
    pq = tmp_path / "b.parquet"
    shutil.copy(os.path.join(corpus["code_parquet"], "part-0.parquet"), pq)
    s3.upload_file(str(pq), "v/b.parquet")
    rc = main(["verify", "--data", f"s3://{BUCKET}/v/a.jsonl.zst", "--data", f"s3://{BUCKET}/v/b.parquet",
               "--weights", "1,1", "--tokenizer", tokenizer_path, "--canonical-replicas", "8", "--dp", "4",
               "--resume-dp", "2,8", "--checkpoint-step", "3", "--steps", "6", "--max-length", "128",
               "--no-progress", "--workers", "1", "--runner", "threads"])
    out = capsys.readouterr().out
    assert rc == 0, out
    assert "OK: all 6 steps" in out
