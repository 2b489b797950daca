"""``zephon explain`` / ``zephon diff`` flags as docs/debugging.md uses them, checked against uninterrupted Loaders
built here: explain with ``--checkpoint`` and no ``--dp``; diff's wording and ``--against`` replacing flags; one
folder opened as two datasets named apart."""
from __future__ import annotations

import json
import os

import pytest

from test_explain import check_rows, delivered
from zephon.checkpoint import merge_states
from zephon.cli import main, main_parser
from zephon.cli_pipeline import build_pipeline as _build_pipeline


@pytest.fixture(scope="module")
def dirs(corpus):
    return [corpus["docs_jsonl"], corpus["code_jsonl"]]


def flags(dirs, tokenizer_path, *more):
    return [a for d in dirs for a in ("--data", d)] + ["--tokenizer", tokenizer_path, "--eos-token", "<eos>",
                                                        "--canonical-replicas", "8", "--max-length", "128",
                                                        "--chunk-size", "16", *more]


def cli_loader(args_list, tokenizer_path, dp, rank=0):
    _, make = _build_pipeline(main_parser().parse_args(["explain", "0", *args_list]), tokenizer_path)
    return make(dp, rank, 1, "inline")


def test_explain_with_a_checkpoint_needs_no_dp(dirs, tokenizer_path, tmp_path, capsys):
    f = flags(dirs, tokenizer_path)
    ranks = [cli_loader(f, tokenizer_path, 2, r) for r in range(2)]
    delivered(ranks, 3)
    path = tmp_path / "ckpt.json"
    path.write_text(json.dumps(merge_states([L.checkpoint() for L in ranks])))
    assert main(["explain", "4", "--json", "--checkpoint", str(path), *f]) == 0
    ex = json.loads(capsys.readouterr().out)
    got = {k: v for k, v in delivered([cli_loader(f, tokenizer_path, 1)], 5).items() if k[0] == 4}
    check_rows(ex, got, tokenizer_path, packed=True)
    assert main(["explain", "4", *f, "--dp", "3"]) == 2
    assert "--dp 3" in capsys.readouterr().err


def test_diff_says_old_and_new_config(dirs, tokenizer_path, capsys):
    f = flags(dirs, tokenizer_path, "--dp", "1")
    assert main(["diff", *f, "--against", "--shuffle-buffer 64", "--compare-steps", "2"]) == 0
    out = capsys.readouterr().out
    assert "old config has 32, new config has 64" in out and "checkpoint" not in out


def test_diff_against_data_replaces_the_data(dirs, tokenizer_path, capsys):
    f = flags(dirs, tokenizer_path, "--weights", "0.5,0.5", "--dp", "1")
    against = f"--data {dirs[1]} --data {dirs[0]}"
    assert main(["diff", *f, "--against", against, "--compare-steps", "2", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    names = [os.path.basename(d) for d in dirs]
    assert sorted(report["moved"]) == sorted(names)  # the old config's two datasets, not four
    assert report["first_differing_step"] == 0  # the swapped mixture changes every lane's first documents


def test_one_folder_opened_twice_is_two_datasets_everywhere(dirs, tokenizer_path, capsys):
    f = flags([dirs[0], dirs[0]], tokenizer_path, "--weights", "0.5,0.5", "--dp", "1")
    assert main(["explain", "0", "--json", *f]) == 0
    ex = json.loads(capsys.readouterr().out)
    name = os.path.basename(dirs[0])
    pieces = [p for r in ex["rows"] for p in r["pieces"]]
    assert {p["dataset"] for p in pieces} == {0, 1}
    assert all(p["dataset_name"] == f"{name}#{p['dataset']}" for p in pieces)
    L = cli_loader(f, tokenizer_path, 1)
    assert sorted(L.metrics()["datasets"]) == [f"{name}#0", f"{name}#1"]
    assert main(["diff", *f, "--against", "--shuffle-buffer 8", "--compare-steps", "2", "--json"]) == 0
    assert sorted(json.loads(capsys.readouterr().out)["moved"]) == [f"{name}#0", f"{name}#1"]


def test_verify_with_a_skip_counts_the_verified_steps_and_says_the_reference_runs_further(dirs, tokenizer_path,
                                                                                          capsys):
    f = flags(dirs, tokenizer_path, "--canonical-replicas", "4", "--dp", "2", "--resume-dp", "4",
              "--checkpoint-step", "3", "--steps", "6", "--no-progress", "--workers", "1")
    assert main(["verify", *f, "--skip", "5:6"]) == 0
    assert "OK: all 6 steps" in capsys.readouterr().out  # steps 0..5, not the reference's 7
    assert main(["verify", *f, "--skip", "4:9"]) == 0
    cap = capsys.readouterr()
    assert "OK: all 6 steps" in cap.out and "the reference runs 11 steps" in cap.err  # step 5 delivers step 10
    assert main(["verify", *f, "--skip", "6:8"]) == 2
    assert "no verified step skips" in capsys.readouterr().err


def test_best_fit_checkpoint_into_concat_names_the_method_only(dirs, tokenizer_path):
    from helpers import make_loader
    from zephon.checkpoint import CheckpointError

    a = make_loader(dirs, tokenizer_path, canonical_replicas=4)
    b = make_loader(dirs, tokenizer_path, canonical_replicas=4, pack_method="concat")
    with pytest.raises(CheckpointError) as e:
        b.restore(a.checkpoint())
    msg = str(e.value)
    assert "checkpoint has 'best_fit', this loader has 'concat'" in msg and "shift_labels" not in msg


def test_explain_names_where_a_concat_fragment_starts_in_its_document(dirs, tokenizer_path):
    from tokenizers import Tokenizer

    from helpers import make_loader
    from test_explain import read_line

    kw = dict(canonical_replicas=4, micro_batch=2, pack_method="concat")
    first = make_loader(dirs, tokenizer_path, **kw)
    delivered([first], 2)
    state = json.loads(json.dumps(first.checkpoint()))  # lanes carry documents cut mid-way
    got = delivered([make_loader(dirs, tokenizer_path, **kw)], 5)
    tok = Tokenizer.from_file(tokenizer_path)
    L = make_loader(dirs, tokenizer_path, **kw)
    for ex in (L.explain(range(2, 5), state=state), L.explain(range(3, 5))):
        cut = 0
        for r in ex["rows"]:
            ids = got[(r["step"], r["lane"], r["micro"], r["row"])][1]
            for p in r["pieces"]:
                full = tok.encode(read_line(p), add_special_tokens=False).ids + [tok.token_to_id("<eos>")]
                (a, b), (s, e) = p["tokens"], p["document_tokens"]
                assert list(ids[a:b]) == full[s:e], (r, p)
                cut += s > 0
        assert cut  # some rows start mid-document


def test_a_checkpoint_that_is_not_json_is_named(dirs, tokenizer_path, tmp_path, capsys):
    """`--checkpoint bad.json` said only "Expecting ',' delimiter": the file is named, with where JSON broke."""
    bad = tmp_path / "bad.json"
    bad.write_text('{"lanes": {"0": 1} "config": {}}')
    f = flags(dirs, tokenizer_path)
    assert main(["explain", "4", "--checkpoint", str(bad), *f]) == 2
    err = capsys.readouterr().err
    assert f"--checkpoint {bad}: not valid JSON" in err and "line 1 column 20" in err, err
    assert main(["diff", *f, "--against", "--seed 1", "--checkpoint", str(bad)]) == 2
    assert f"--checkpoint {bad}: not valid JSON" in capsys.readouterr().err


def test_explain_far_step_without_a_checkpoint_is_refused_at_once(dirs, tokenizer_path, capsys):
    """`zephon explain 100000000` ran with no end in sight (killed after 120 s): it is refused before any work,
    saying to pass --checkpoint; the bound is --max-replay-steps."""
    import subprocess
    import sys
    import time

    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    t0 = time.monotonic()
    r = subprocess.run([sys.executable, "-m", "zephon.cli", "explain", "100000000",
                        *flags(dirs, tokenizer_path)], capture_output=True, text=True, timeout=60, env=env)
    assert time.monotonic() - t0 < 60 and r.returncode == 2, r.stderr
    assert "without --checkpoint" in r.stderr and "to step 100000000" in r.stderr and "--max-replay-steps" in r.stderr
    assert main(["explain", "4", "--max-replay-steps", "3", *flags(dirs, tokenizer_path)]) == 2
    assert "raise --max-replay-steps (3" in capsys.readouterr().err
    assert main(["explain", "3", "--max-replay-steps", "3", "--json", *flags(dirs, tokenizer_path)]) == 0
    assert json.loads(capsys.readouterr().out)["steps"] == [3, 4]
