"""Invariant 6: bad input gets a clear error naming file, shard and sample (or what differs);
the skip option counts and reports instead."""
from __future__ import annotations

import gzip
import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import zstandard

from zephon.checkpoint import CheckpointError, merge_states
from zephon.formats import DataError, open_dataset
from zephon.work import TopologyError

from helpers import make_loader


def _write_jsonl(path, texts, bad_lines=()):
    with open(path, "w") as fh:
        for i, t in enumerate(texts):
            fh.write((bad_lines[i] if i in bad_lines else json.dumps({"text": t})) + "\n")


def _drain(loader, limit=10_000):
    out = []
    for k, mb in enumerate(loader):
        out.append(mb)
        if k >= limit:
            break
    loader.close()
    return out


@pytest.fixture
def texts(stdlib_texts):
    return stdlib_texts[0][:40]


def test_malformed_jsonl_line_names_file_shard_sample(tmp_path, texts, tokenizer_path):
    d = tmp_path / "data"
    d.mkdir()
    _write_jsonl(d / "a.jsonl", texts)
    _write_jsonl(d / "b.jsonl", texts, bad_lines={7: '{"text": "unterminated'})
    L = make_loader([str(d)], tokenizer_path, canonical_replicas=1, exhaustion="stop", global_batch_size=1)
    with pytest.raises(DataError) as e:
        _drain(L)
    msg = str(e.value)
    assert str(d / "b.jsonl") in msg and "shard 1" in msg and "sample 7" in msg and "line 8" in msg


def test_missing_field_names_file_shard_sample_and_field(tmp_path, texts, tokenizer_path):
    d = tmp_path / "data"
    d.mkdir()
    _write_jsonl(d / "a.jsonl", texts, bad_lines={3: json.dumps({"body": "no text field here"})})
    L = make_loader([str(d)], tokenizer_path, canonical_replicas=1, exhaustion="stop", global_batch_size=1)
    with pytest.raises(DataError) as e:
        _drain(L)
    msg = str(e.value)
    assert str(d / "a.jsonl") in msg and "shard 0" in msg and "sample 3" in msg and "'text'" in msg


def test_skip_mode_counts_and_reports_and_keeps_the_rest(tmp_path, texts, tokenizer_path):
    d = tmp_path / "data"
    d.mkdir()
    _write_jsonl(d / "a.jsonl", texts, bad_lines={2: "not json", 30: "[1, 2]"})
    L = make_loader([str(d)], tokenizer_path, canonical_replicas=2, exhaustion="stop", global_batch_size=2,
                    drop_last=False, on_error="skip", max_length=4096)
    positions = [p for mb in _drain(L) for srcs in mb["__src__"] for p, _ in srcs]
    stats = L.stats()
    assert stats["skipped"] == 2 and len(stats["skipped_messages"]) == 2
    assert any("sample 2" in m for m in stats["skipped_messages"])
    assert any("sample 30" in m for m in stats["skipped_messages"])
    assert len(positions) == len(set(positions)) == len(texts) - 2


def test_empty_file_is_refused_naming_it(tmp_path):
    (tmp_path / "empty.jsonl").write_text("")
    with pytest.raises(DataError, match="empty.jsonl"):
        open_dataset(str(tmp_path / "empty.jsonl"))


def test_truncated_zst_is_refused_naming_it(tmp_path, texts):
    blob = zstandard.ZstdCompressor().compress("".join(json.dumps({"text": t}) + "\n" for t in texts).encode())
    (tmp_path / "cut.jsonl.zst").write_bytes(blob[: len(blob) // 2])
    with pytest.raises(DataError, match="cut.jsonl.zst"):
        open_dataset(str(tmp_path / "cut.jsonl.zst"))


def test_truncated_gz_is_refused_naming_it(tmp_path, texts):
    blob = gzip.compress("".join(json.dumps({"text": t}) + "\n" for t in texts).encode())
    (tmp_path / "cut.jsonl.gz").write_bytes(blob[: len(blob) // 2])
    with pytest.raises(DataError, match="cut.jsonl.gz"):
        open_dataset(str(tmp_path / "cut.jsonl.gz"))


def test_parquet_without_the_column_is_refused_naming_file_and_column(tmp_path):
    pq.write_table(pa.table({"body": ["a", "b"]}), tmp_path / "x.parquet")
    with pytest.raises(DataError) as e:
        open_dataset(str(tmp_path / "x.parquet"), columns=["text"])
    assert "x.parquet" in str(e.value) and "text" in str(e.value)


def test_dp_degree_that_does_not_divide_is_refused(corpus, tokenizer_path):
    with pytest.raises(TopologyError, match=r"dp_degree=3 does not divide canonical_replicas=8.*\[1, 2, 4, 8\]"):
        make_loader([corpus["docs_jsonl"]], tokenizer_path, dp=3)


@pytest.mark.parametrize("change, expected", [
    (dict(seed=1), "work.seed: checkpoint has 0, this loader has 1"),
    (dict(weights=[0.5, 0.5]), "work.weights differ: checkpoint [0.7, 0.3] vs this loader [0.5, 0.5]"),
    (dict(max_length=64), "max_length"),
    (dict(chunk_size=64), "work.chunk_size"),
    (dict(canonical_replicas=4, global_batch_size=8), "canonical_replicas"),
    (dict(shuffle_buffer=0), "ops"),
])
def test_checkpoint_from_another_config_says_what_differs(corpus, tokenizer_path, change, expected):
    dirs = [corpus["docs_jsonl"], corpus["code_jsonl"]]
    base = dict(weights=[0.7, 0.3])
    state = make_loader(dirs, tokenizer_path, **base).checkpoint()
    other = make_loader(dirs, tokenizer_path, **{**base, **change})
    with pytest.raises(CheckpointError, match="another config") as e:
        other.restore(state)
    assert expected in str(e.value)


def test_checkpoint_from_other_datasets_is_refused(corpus, tokenizer_path):
    state = make_loader([corpus["docs_jsonl"]], tokenizer_path).checkpoint()
    with pytest.raises(CheckpointError, match="datasets"):
        make_loader([corpus["code_jsonl"]], tokenizer_path).restore(state)


def test_restoring_with_missing_lanes_names_them(corpus, tokenizer_path):
    ranks = [make_loader([corpus["docs_jsonl"]], tokenizer_path, dp=4, rank=r) for r in range(4)]
    with pytest.raises(CheckpointError, match=r"lacks lanes \[2, 3, 4, 5, 6, 7\]"):
        make_loader([corpus["docs_jsonl"]], tokenizer_path, dp=1).restore(ranks[0].checkpoint())
    # rank 1 of dp=4 owns lanes 2-3: rank 0's state alone cannot restore it either
    with pytest.raises(CheckpointError, match=r"lacks lanes \[2, 3\]"):
        make_loader([corpus["docs_jsonl"]], tokenizer_path, dp=4, rank=1).restore(ranks[0].checkpoint())
    with pytest.raises(CheckpointError, match=r"lacks lanes 2-3 of 8"):
        merge_states([ranks[r].checkpoint() for r in (0, 2, 3)])


def test_not_a_checkpoint_is_refused(corpus, tokenizer_path):
    with pytest.raises(CheckpointError, match="not a Zephon checkpoint"):
        make_loader([corpus["docs_jsonl"]], tokenizer_path).restore({"epoch": 3})


@pytest.mark.parametrize("field, value", [("replay_cursor", 10 ** 6), ("sentinel_chunk", 3), ("delivered_rows", "5"),
                                          ("replay_cursor", None), ("sentinel_chunk", 10 ** 30)])
def test_tampered_checkpoint_is_refused(corpus, tokenizer_path, field, value):
    L = make_loader([corpus["docs_jsonl"]], tokenizer_path)
    state = json.loads(json.dumps(L.checkpoint()))
    state["lanes"][0][field] = value
    with pytest.raises(CheckpointError, match="altered"):
        make_loader([corpus["docs_jsonl"]], tokenizer_path).restore(state)


def test_inconsistent_lane_entry_is_refused_even_with_a_matching_digest(corpus, tokenizer_path):
    from zephon.checkpoint import digest

    state = make_loader([corpus["docs_jsonl"]], tokenizer_path).checkpoint()
    state["lanes"][0]["replay_cursor"] = 5  # more than delivered_rows (0)
    state["lanes_sha256"] = digest(state["lanes"])
    with pytest.raises(CheckpointError, match="replay_cursor exceeds delivered_rows"):
        make_loader([corpus["docs_jsonl"]], tokenizer_path).restore(state)


def test_operator_combinations_that_cannot_work_are_refused_at_construction(corpus, tokenizer_path):
    from zephon.engine import Loader
    from zephon.ops import Decode, EnsureMixture, Pack, Tokenize

    ds = [open_dataset(corpus["docs_jsonl"])]
    with pytest.raises(ValueError, match="put a Tokenize operator before"):
        Loader(ds, [Decode(), Pack(64)])
    with pytest.raises(ValueError, match=r"use Tokenize\(max_length=64\)"):
        Loader(ds, [Decode(), Tokenize(tokenizer_path, eos_id="<eos>", max_length=128), Pack(64)])
    with pytest.raises(ValueError, match="2 weights for 1 datasets"):
        Loader(ds, [Decode(), Tokenize(tokenizer_path, eos_id="<eos>", max_length=64), EnsureMixture([1, 1]),
                    Pack(64)])
    with pytest.raises(ValueError, match="global_batch_size"):
        Loader(ds, [Decode(), Tokenize(tokenizer_path, eos_id="<eos>", max_length=64), Pack(64)],
               global_batch_size=0)


def test_skip_mode_skips_bad_field_values_too(tmp_path, texts, tokenizer_path):
    d = tmp_path / "data"
    d.mkdir()
    _write_jsonl(d / "a.jsonl", texts, bad_lines={4: json.dumps({"txt": "x"}), 9: json.dumps({"text": None}),
                                                  12: '{"text": "lone \\ud800 surrogate"}'})
    L = make_loader([str(d)], tokenizer_path, canonical_replicas=2, exhaustion="stop", global_batch_size=2,
                    drop_last=False, on_error="skip", max_length=4096)
    positions = [p for mb in _drain(L) for srcs in mb["__src__"] for p, _ in srcs]
    stats = L.stats()
    assert stats["skipped"] == 3, stats
    skipped_samples = [int(m.split("sample ")[1].split(")")[0].split(",")[0]) for m in stats["skipped_messages"]]
    assert sorted(skipped_samples) == [4, 9, 12]
    assert len(positions) == len(set(positions)) == len(texts) - 3


def test_lone_surrogate_raises_a_named_error(tmp_path, texts, tokenizer_path):
    d = tmp_path / "data"
    d.mkdir()
    _write_jsonl(d / "a.jsonl", texts, bad_lines={6: '{"text": "lone \\ud800 surrogate"}'})
    L = make_loader([str(d)], tokenizer_path, canonical_replicas=1, exhaustion="stop", global_batch_size=1,
                    max_length=4096)
    with pytest.raises(DataError, match=r"a.jsonl \(shard 0, sample 6, line 7\).*UTF-8"):
        _drain(L)


def test_file_changed_under_a_running_loader_is_reported(tmp_path, texts, tokenizer_path):
    d = tmp_path / "data"
    d.mkdir()
    _write_jsonl(d / "a.jsonl", texts)
    L = make_loader([str(d)], tokenizer_path, canonical_replicas=1, exhaustion="stop", global_batch_size=1)
    with open(d / "a.jsonl", "a") as fh:
        fh.write(json.dumps({"text": "appended later"}) + "\n")
    with pytest.raises(DataError, match="a.jsonl \\(shard 0\\): file changed since the dataset was opened"):
        _drain(L)


def test_finite_pass_with_lanes_that_get_no_sample_is_refused(tmp_path):
    """5 samples over 8 lanes: 3 lanes would get nothing. With drop_last no step could complete; without it a
    rank whose lanes are all empty would have no row to shape its padding on (at dp 4, not at dp 1). So it is
    refused at every dp, in both modes, saying which canonical_replicas fits."""
    from zephon import Batch, Decode, Loader, open_dataset

    (tmp_path / "few.jsonl").write_text("".join(f'{{"text": "t{i}"}}\n' for i in range(5)))
    for drop_last in (True, False):
        for dp in (1, 4):
            with pytest.raises(ValueError, match=r"5 samples over canonical_replicas=8 lanes leaves 3 lanes without"
                                                 r".*canonical_replicas <= 5"):
                Loader([open_dataset(str(tmp_path))], [Decode(), Batch(1, drop_last=drop_last)], canonical_replicas=8,
                       exhaustion="stop", dp_degree=dp)


def test_finite_pass_gives_every_lane_its_share_whatever_the_chunk_size(corpus, tokenizer_path, caplog):
    """900 samples in chunks of 256 over 8 lanes used to leave lanes 4-7 empty (whole chunks); the pass is now
    split so every lane holds a share: packed, by size (ALGORITHM_VERSION 3): each lane's bytes (line lengths
    read here) within one document of an eighth of the file, and nothing warns of a lane-dependent drop."""
    from helpers import make_loader

    with caplog.at_level("WARNING", logger="zephon"):
        L = make_loader([corpus["docs_jsonl"]], tokenizer_path, exhaustion="stop", chunk_size=256,
                        flush_every_k_chunks=1)
    ds = L.source.datasets[0]
    lines = [[len(x) for x in open(ds.shards[s].path, "rb") if x.strip()] for s in range(len(ds.shards))]
    lane_bytes = []
    for lane in range(8):
        chunks = [L.source.chunk(lane, c) for c in range(L.source.num_chunks(lane))]
        lane_bytes.append(sum(lines[s][i] for c in chunks for s, i in zip(c.shard_ids, c.sample_idx)))
    assert min(L.source.lane_positions(lane) for lane in range(8)) > 0
    assert sum(L.source.lane_positions(lane) for lane in range(8)) == 900
    biggest = max(max(x) for x in lines)
    assert max(abs(b - sum(map(sum, lines)) / 8) for b in lane_bytes) <= biggest, lane_bytes
    assert not any("dropped" in r.getMessage() for r in caplog.records)


# -- issue 15, item 8: messages say what the user gave and what to do ------------------------------------------


def test_unbounded_tokenize_before_pack_reports_none_and_what_to_pass(corpus, tokenizer_path):
    from zephon.engine import Loader
    from zephon.ops import Decode, Pack, Tokenize

    ds = [open_dataset(corpus["docs_jsonl"])]
    with pytest.raises(ValueError) as e:
        Loader(ds, [Decode(), Tokenize(tokenizer_path, eos_id="<eos>", max_length=None), Pack(128)])
    msg = str(e.value)
    assert msg.startswith("Tokenize(max_length=None) lets documents longer than Pack(max_length=128) through")
    assert "use Tokenize(max_length=128)" in msg


def test_a_path_instead_of_datasets_says_to_use_open_dataset(corpus):
    from zephon import Batch, Decode, Loader

    with pytest.raises(TypeError) as e:
        Loader("dir/", [Decode(), Batch(1)])
    msg = str(e.value)
    assert "datasets must be a list of open_dataset(...) results" in msg and "got str 'dir/'" in msg
    assert "[open_dataset('dir/')]" in msg
    with pytest.raises(TypeError, match=r"datasets\[1\] is str 'b/': use open_dataset\('b/'\)"):
        Loader([open_dataset(corpus["docs_jsonl"]), "b/"], [Decode(), Batch(1)])
    with pytest.raises(TypeError, match="got a Dataset: wrap it in a list"):
        Loader(open_dataset(corpus["docs_jsonl"]), [Decode(), Batch(1)])


def test_unknown_runner_is_refused_at_construction_naming_the_valid_ones(corpus):
    from zephon import Batch, Decode, Loader

    with pytest.raises(ValueError) as e:
        Loader([open_dataset(corpus["docs_jsonl"])], [Decode(), Batch(1)], runner="gpu")
    msg = str(e.value)
    assert "'inline', 'threads', 'processes'" in msg and "got 'gpu'" in msg


def test_uneven_tail_warning_is_logged_once_per_process_in_the_hosts_words(tmp_path, caplog):
    from zephon import Batch, Decode
    from zephon.host import RankSession

    (tmp_path / "d.jsonl").write_text("".join(f'{{"text": "t{i}"}}\n' for i in range(16)))

    def make(**kw):
        return RankSession.from_config([open_dataset(str(tmp_path))], [Decode(), Batch(1, drop_last=False)],
                                       canonical_replicas=2, chunk_size=4, exhaustion="stop", seed=7, pad_tail=False,
                                       **kw)

    energon_words = {"host": "zephon_energon", "drop_last": "batch_drop_last={}", "finite": "repeat=False",
                     "dropped": "loader.dropped_rows"}
    with caplog.at_level("WARNING", logger="zephon"):
        for _ in range(3):  # three loaders (sessions) of one config, each hitting the uneven tail twice
            s = make(warn_context=energon_words)
            s._count_uneven_tail(3)
            s._count_uneven_tail(2)
            assert s.dropped_rows == 5  # counted every time, logged once
    msgs = [r.getMessage() for r in caplog.records if "another rank ran out" in r.getMessage()]
    assert len(msgs) == 1, msgs
    assert msgs[0].startswith("zephon_energon: a finite pass (repeat=False) with batch_drop_last=False")
    assert "batch_drop_last=True ends every rank" in msgs[0] and "exhaustion" not in msgs[0]
    assert "Batch(drop_last" not in msgs[0] and "loader.dropped_rows" in msgs[0]
    caplog.clear()
    with caplog.at_level("WARNING", logger="zephon"):
        s = make()  # the core's own words where no adapter built the session
        s._count_uneven_tail(1)
    (msg,) = [r.getMessage() for r in caplog.records]
    assert "exhaustion='stop'" in msg and "Batch(drop_last=False)" in msg and "Batch(drop_last=True)" in msg
