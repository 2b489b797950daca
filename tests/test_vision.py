"""The vision-language pipeline (zephon.ops.vision) on MDS and Energon datasets made by the peers' own writers.

Oracles are computed here, independently of the operators: pixels by PIL + numpy from the JPEG bytes written,
caption ids by the byte rule (UTF-8 byte b -> b + 3, <bos> 1, <eos> 2, pad 0), global batches by a test-side hash
of an uninterrupted single-rank inline run.
"""
from __future__ import annotations

import hashlib
import io
import math
import sys
import threading
from collections import Counter, defaultdict

import numpy as np
import pytest

from vl_data import natural_jpeg, sample_number, vl_loader, write_energon, write_mds
from zephon.formats import DataError
from zephon.ops import (ByteTokenizer, CaptionTokens, DecodeImage, Normalize, RandomResizedCrop, Tokenize,
                        load_tokenizer, vision_language_ops)
from zephon.ops.base import RecordError

N = 20
MEAN = np.array([0.48145466, 0.4578275, 0.40821073], np.float64)
STD = np.array([0.26862954, 0.26130258, 0.27577711], np.float64)


@pytest.fixture(scope="module")
def vl(tmp_path_factory):
    """``{"samples": {i: (jpeg, caption)}, "mds": root, "energon": root}`` of the same N pictures."""
    d = tmp_path_factory.mktemp("vl")
    samples = {i: natural_jpeg(i) for i in range(N)}
    write_mds(str(d / "mds"), N, size_limit=1 << 19, samples=samples)  # several shards
    write_energon(str(d / "energon"), N, per_shard=6, samples=samples)
    return {"samples": samples, "mds": str(d / "mds"), "energon": str(d / "energon")}


def expected_ids(caption: str, n: int = 64) -> np.ndarray:
    ids = ([1] + [b + 3 for b in caption.encode("utf-8")] + [2])[:n]
    return np.array(ids + [0] * (n - len(ids)), np.int32)


def caption_of(ids) -> str:
    return bytes(int(i) - 3 for i in ids if int(i) >= 3).decode("utf-8", "replace")


def step_digests(loaders, steps):
    """Test-side hash: per step, lanes ascending, rows in delivery order, pixel and token bytes."""
    rows = defaultdict(lambda: defaultdict(list))
    iters = [iter(L) for L in loaders]
    for _ in range(steps):
        for L, it in zip(loaders, iters):
            for _ in range(len(L.lanes) * (L.rows_per_lane_step // L.batch.micro_batch_size)):
                mb = next(it)
                for j in range(len(mb["input_ids"])):
                    rows[mb["__step__"]][mb["__lane__"]].append(
                        mb["pixel_values"][j].tobytes() + mb["input_ids"][j].tobytes())
    for it, L in zip(iters, loaders):
        it.close()
        L.close()
    return {s: hashlib.sha256(b"".join(r for lane in sorted(ls) for r in ls[lane])).hexdigest()
            for s, ls in rows.items()}


# ------------------------------------------------------------------------------ tokens


def test_byte_tokenizer_ids_and_fallback_without_tokenizers(monkeypatch):
    tok = load_tokenizer("bytes")
    text = "caf\u00e9 #1 \u4e2d"
    assert tok.encode_batch([text])[0].ids == [b + 3 for b in text.encode("utf-8")]
    assert tok.decode(tok.encode_batch([text])[0].ids) == text
    monkeypatch.setitem(sys.modules, "tokenizers", None)  # as on 3.13t, where it has no wheel
    with pytest.raises(ImportError, match="tokenizers.*not installed.*tokenizer='bytes'"):
        load_tokenizer("/data/tokenizer.json")
    op = Tokenize("bytes", eos_id="<eos>")
    out = op.process_many([{"text": "ab", "__src__": (0, 0, 0, 0)}])
    assert out[0]["input_ids"].tolist() == [ord("a") + 3, ord("b") + 3, 2]
    assert isinstance(load_tokenizer(ByteTokenizer()), ByteTokenizer)


def test_caption_tokens_pad_truncate_and_bad_text():
    op = CaptionTokens(max_length=8)
    recs = [{"caption": "ab", "__src__": (0, 0, 0, 0)}, {"caption": "x" * 20, "__src__": (0, 0, 1, 1)}]
    out = op.process_many(recs)
    assert out[0]["input_ids"].tolist() == expected_ids("ab", 8).tolist()
    assert out[0]["attention_mask"].tolist() == [1, 1, 1, 1, 0, 0, 0, 0]
    assert out[1]["input_ids"].tolist() == expected_ids("x" * 20, 8).tolist() and out[1]["caption_tokens"] == 22
    with pytest.raises(RecordError, match="no UTF-8 form") as e:
        op.process_many([{"caption": "bad \ud800", "__src__": (0, 1, 2, 3)}])
    assert e.value.src == (0, 1, 2, 3)


# ------------------------------------------------------------------------------ crop


def _decoded(vl, i, src):
    jpg, cap = vl["samples"][i]
    return DecodeImage("jpg", "txt").process_many([{"jpg": jpg, "txt": cap, "__src__": src}])[0]


def test_crop_is_a_function_of_the_sample_pointer(vl):
    op = RandomResizedCrop(224, seed=5)
    a = op.process_many([_decoded(vl, 3, (0, 1, 3, 10))])[0]
    # the same pointer at another position, in another batch, after other samples: the same crop and pixels
    b = op.process_many([_decoded(vl, 4, (0, 1, 4, 11)), _decoded(vl, 3, (0, 1, 3, 9999))])[1]
    assert a["crop_box"] == b["crop_box"]
    assert np.array_equal(np.asarray(a["image"]), np.asarray(b["image"]))
    # another pointer (even of the same picture), or another seed: another crop
    c = op.process_many([_decoded(vl, 3, (0, 1, 5, 10))])[0]
    d = RandomResizedCrop(224, seed=6).process_many([_decoded(vl, 3, (0, 1, 3, 10))])[0]
    assert a["crop_box"] != c["crop_box"] and a["crop_box"] != d["crop_box"]
    # vary_by_pass: a new crop at another global position, still fixed for a given one
    v = RandomResizedCrop(224, seed=5, vary_by_pass=True)
    boxes = {v.process_many([_decoded(vl, 3, (0, 1, 3, p))])[0]["crop_box"] for p in (10, 11, 12, 10)}
    assert len(boxes) == 3


def test_crop_boxes_obey_scale_and_ratio(vl):
    op = RandomResizedCrop(224, scale=(0.35, 1.0), ratio=(3 / 4, 4 / 3))
    for i in range(N):
        rec = op.process_many([_decoded(vl, i, (0, 0, i, i))])[0]
        from PIL import Image

        w0, h0 = Image.open(io.BytesIO(vl["samples"][i][0])).size
        x, y, w, h = rec["crop_box"]
        assert 0 <= x and x + w <= w0 and 0 <= y and y + h <= h0
        assert 0.35 * 0.97 <= w * h / (w0 * h0) <= 1.0
        assert 3 / 4 * 0.97 <= w / h <= 4 / 3 * 1.03
        assert rec["image"].size == (224, 224)


# ------------------------------------------------------------------------------ loader


def test_rows_match_an_independent_decode_crop_normalise(vl):
    """Every row of an inline run over the Energon dataset equals PIL + numpy applied here to the JPEG written
    for its sample (named by its caption), with the crop box the row reports."""
    from PIL import Image

    L = vl_loader("energon", vl["energon"], runner="inline", exhaustion="stop", drop_last=False)
    seen = Counter()
    for mb in L:
        for j in range(len(mb["input_ids"])):
            if not mb["attention_mask"][j].any():
                continue  # a padding row of the last step
            i = sample_number(caption_of(mb["input_ids"][j]))
            seen[i] += 1
            jpg, cap = vl["samples"][i]
            assert mb["input_ids"][j].tolist() == expected_ids(cap).tolist()
            x, y, w, h = mb["crop_box"][j]
            img = Image.open(io.BytesIO(jpg)).convert("RGB").resize((224, 224), Image.Resampling.BILINEAR,
                                                                     box=(x, y, x + w, y + h))
            want = ((np.asarray(img, np.float64) / 255.0 - MEAN) / STD).transpose(2, 0, 1)
            got = mb["pixel_values"][j]
            assert got.dtype == np.float32 and got.shape == (3, 224, 224)
            np.testing.assert_allclose(got, want, atol=2e-5)
    L.close()
    assert seen == Counter(range(N))  # one pass: every sample exactly once


@pytest.mark.parametrize("kind", ["mds", "energon"])
def test_global_batches_identical_across_runners_and_dp(vl, kind):
    steps = 3
    ref = step_digests([vl_loader(kind, vl[kind], runner="inline")], steps)
    assert len(ref) == steps and len(set(ref.values())) == steps
    for runner in ("threads", "processes"):
        assert step_digests([vl_loader(kind, vl[kind], runner=runner)], steps) == ref, runner
    for dp, runner in ((2, "threads"), (4, "inline")):
        loaders = [vl_loader(kind, vl[kind], runner=runner, dp=dp, rank=r) for r in range(dp)]
        assert step_digests(loaders, steps) == ref, (dp, runner)


def test_operators_are_thread_safe_on_shared_instances(vl):
    """The same operator objects on 8 threads at once give what one thread gives (no shared mutable state)."""
    ops = vision_language_ops(image="jpg", caption="txt", seed=3)
    recs = [{"jpg": vl["samples"][i][0], "txt": vl["samples"][i][1], "__src__": (0, 0, i, i)} for i in range(N)]

    def run(batch):
        for op in ops:
            batch = op.process_many(batch)
        return [(r["pixel_values"].tobytes(), r["input_ids"].tobytes(), r["crop_box"]) for r in batch]

    serial = run(list(recs))
    results, errors = [None] * 8, []

    def worker(k):
        try:
            results[k] = run(recs[k % 3:] + recs[:k % 3])
        except Exception as e:  # surfaced below
            errors.append(e)

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    for k, res in enumerate(results):
        assert res == serial[k % 3:] + serial[:k % 3]


def test_bad_jpeg_names_file_shard_and_sample(tmp_path):
    """Image bytes that do not decode: a DataError naming the file, shard and sample (Parquet ``bytes`` column)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from zephon.engine import Loader
    from zephon.formats import open_dataset
    from zephon.ops import Batch

    for k in range(2):
        rows = [natural_jpeg(2 * k + j) for j in range(2)]
        if k == 1:
            rows[1] = (b"\xff\xd8\xff not a jpeg", rows[1][1])
        pq.write_table(pa.table({"jpg": [r[0] for r in rows], "txt": [r[1] for r in rows]}),
                       tmp_path / f"part-{k}.parquet")
    L = Loader([open_dataset(str(tmp_path))], vision_language_ops(image="jpg", caption="txt") + [Batch(1)],
               canonical_replicas=2, chunk_size=2, exhaustion="stop", shuffle=False, runner="threads")
    with pytest.raises(DataError, match=r"part-1\.parquet.*shard 1, sample 1.*does not decode as an image"):
        list(L)
    L.close()


def test_normalize_and_decode_refuse_wrong_input():
    with pytest.raises(RecordError, match="missing field 'jpeg'.*fields present"):
        DecodeImage("jpeg").process_many([{"image": b"", "__src__": (0, 0, 0, 0)}])
    with pytest.raises(RecordError, match="is int, expected image bytes"):
        DecodeImage("image").process_many([{"image": 3, "caption": "c", "__src__": (0, 0, 0, 0)}])
    with pytest.raises(RecordError, match="needs 'image'"):
        Normalize().process_many([{"__src__": (0, 0, 0, 0)}])
    with pytest.raises(ValueError, match="std > 0"):
        Normalize(std=(1, 0, 1))
    assert math.isclose(Normalize(mean=(0, 0, 0), std=(1, 1, 1)).process_many(
        [{"image": np.full((2, 2, 3), 255, np.uint8), "__src__": None}])[0]["pixel_values"].max(), 1.0)
