"""benchmarks/stall.py ``--pipeline vl`` (benchmarks/stall_vl.py): the stall loop over images and captions."""
from __future__ import annotations

import pytest

pytest.importorskip("PIL")
pytest.importorskip("streaming")


@pytest.mark.parametrize("config", ["threads", "zephon_streaming", "zephon_energon"])
def test_vl_pipeline_steps_are_images_with_captions(config):
    """A step is 64 decoded, resized images with their captions' tokens, read from the MDS copy of the samples."""
    from tokenizers import Tokenizer

    from benchmarks.prepare import prepare
    from benchmarks.stall_vl import prepare_vl, vl_iterator
    from zephon.demo_corpus import default_workdir

    workdir = default_workdir()
    tok = prepare(workdir, quick=True, log=lambda *_: None)["tokenizer"]
    vl = prepare_vl(workdir, quick=True)
    it, per_step, count, unit = vl_iterator({"config": config, "lanes": 8, "tokenizer": tok, "vl": vl})
    step = [next(it) for _ in range(per_step)]
    assert unit == "images" and sum(count(mb) for mb in step) == 64
    t = Tokenizer.from_file(tok)
    numbers = []
    for mb in step:
        assert tuple(mb["pixel_values"].shape) == (8, 3, 224, 224) and tuple(mb["input_ids"].shape) == (8, 64)
        for ids, mask in zip(mb["input_ids"], mb["attention_mask"]):
            text = t.decode([int(i) for i, m in zip(ids, mask) if m], skip_special_tokens=True)
            assert text.startswith("#"), text  # tests/vl_data.py's captions start with the sample's number
            numbers.append(int(text[1:6]))
    assert all(0 <= n < vl["n"] for n in numbers) and len(set(numbers)) > 8
    getattr(it, "close", lambda: None)()


def test_stall_vl_option_prints_a_row_per_runner(capsys):
    from benchmarks.stall import main

    assert main(["--pipeline", "vl", "--quick", "--steps", "2", "--warmup", "1", "--lanes", "8",
                 "--configs", "inline,processes"]) == 0
    out = capsys.readouterr().out
    rows = [line for line in out.splitlines() if line.startswith("| ")][1:]
    assert [r.split(" | ")[0][2:] for r in rows] == ["inline", "processes"]
    assert not [r for r in rows if "failed" in r], rows
    assert all(" images/s" in r.split(" | ")[1] and r.split(" | ")[4].endswith("%") for r in rows), rows
