"""Pinned outputs: the exact results of the stream-defining algorithms for small fixed inputs.

A checkpoint stores chunk ids and cursors, never pointer lists or buffered records: a resume regenerates the
stream from the config. So if the index permutation, the mixture allocation, ``WorkSource.chunk``, the shuffle
hash or packing changes by one bit, an old checkpoint restores onto a different stream and nothing complains.
This test makes such a change loud: each pinned item has a ``compute_<item>()`` whose output is compared with
``GOLDEN[item]`` (values computed once, with the code of issue 12, and written here as literals; big outputs as the
SHA-256 of their canonical JSON, small ones literally so that a diff is readable).

If a change to one of these algorithms is intended, it must come with a new algorithm version in the config
fingerprint (so old checkpoints are refused, naming both versions), and then the values here are re-pinned:
``.venv/bin/python tests/test_golden.py`` prints the current ``GOLDEN``.

``test_golden_check_can_fail`` proves the comparison is not vacuous: it changes each algorithm by one bit (a
constant, a tie-break, a hash seed, best fit to first fit, or one output xor 1) and expects a reported mismatch.
"""
from __future__ import annotations

import hashlib
import json
import tempfile
from pathlib import Path

import numpy as np
import pytest

from zephon.ops import pack as pack_mod
from zephon.ops import shuffle as shuffle_mod
from zephon.work import mixture as mixture_mod
from zephon.work import permute
from zephon.work import source as source_mod

# ---------------------------------------------------------------- canonical form and comparison


def plain(obj):
    """``obj`` as plain JSON data: numpy arrays and scalars to lists and ints, tuples to lists, keys to str."""
    if isinstance(obj, np.ndarray):
        return obj.tolist()
    if isinstance(obj, np.generic):
        return obj.item()
    if isinstance(obj, (list, tuple)):
        return [plain(v) for v in obj]
    if isinstance(obj, dict):
        return {str(k): plain(v) for k, v in obj.items()}
    return obj


def canonical(obj) -> str:
    """Canonical JSON text of ``obj`` (sorted keys, no spaces): the form every pinned value is compared in."""
    return json.dumps(plain(obj), sort_keys=True, separators=(",", ":"))


def sha256(obj) -> str:
    """SHA-256 (hex) of the canonical JSON of ``obj``: how big outputs are pinned."""
    return hashlib.sha256(canonical(obj).encode()).hexdigest()


def _short(obj, limit: int = 300) -> str:
    text = canonical(obj)
    return text if len(text) <= limit else text[:limit] + f"... ({len(text)} chars)"


def golden_mismatches(item: str, actual: dict) -> list[str]:
    """One line per top-level key of ``GOLDEN[item]`` whose value differs from ``actual`` (or is missing)."""
    expected = GOLDEN[item]
    out = []
    for key in sorted(set(expected) | set(actual)):
        e, a = expected.get(key, "<missing>"), actual.get(key, "<missing>")
        if canonical(e) != canonical(a):
            out.append(f"{item}.{key}: pinned {_short(e)}\n    now {_short(a)}")
    return out


# ---------------------------------------------------------------- the pinned computations
# Algorithms are reached through their modules' attributes (``permute.mix64``, not an imported name), so the
# "can fail" checks can swap in a changed copy with monkeypatch.


def compute_permutation() -> dict:
    """mix64 and derive_key on fixed inputs; IndexPermutation of small sizes in full, of large ones sampled."""
    xs = np.array([0, 1, 2, 0xDEADBEEF, 1 << 63, (1 << 64) - 1], dtype=np.uint64)
    keys = [permute.derive_key(0), permute.derive_key(1234, "shard-order", 0, 0),
            permute.derive_key(1234, "in-shard", 2, 1, 3), permute.derive_key("shuffle", 42),
            permute.derive_key(7, "block", 1, 0, 5)]
    small = {n: permute.IndexPermutation(n, permute.derive_key("golden", n))(np.arange(n))
             for n in (1, 2, 3, 5, 10, 17)}
    big = permute.IndexPermutation(1000, permute.derive_key("golden", 1000))(np.arange(1000))
    huge = permute.IndexPermutation(1_000_003, permute.derive_key("golden", 1_000_003))
    return {
        "mix64": permute.mix64(xs),
        "derive_key": keys,
        "perm_small": small,
        "perm_1000_head": big[:16],
        "perm_1000_sha256": sha256(big),
        "perm_1000003_sampled": huge(np.array([0, 1, 2, 123_456, 999_999, 1_000_002])),
        "perm_scalar": permute.IndexPermutation(1000, 99)(7),
    }


def compute_mixture() -> dict:
    """integer_weights of fixed weight lists (exact and rounded branches); Mixture.assign and count."""
    from fractions import Fraction

    weight_lists = [[1, 1], [0.7, 0.3], [1, 2, 3], [0.5, Fraction(1, 3)], [0.1, 0.2, 0.3, 0.4], [1e-9, 1.0],
                    [2 ** 40, 1]]
    m4 = mixture_mod.Mixture([3, 5, 7, 11])
    ds4, ks4 = m4.assign(np.arange(48))
    ds2, ks2 = mixture_mod.Mixture([0.7, 0.3]).assign(np.arange(20))
    ds5, ks5 = mixture_mod.Mixture([5, 1, 1, 2, 9]).assign(np.arange(5000))
    # (t + 1) * W >= 2**62 takes the exact Python-int path.
    far_ds, far_ks = mixture_mod.Mixture([1, 3, 5]).assign(np.array([10 ** 12, 1 << 60, (1 << 61) + 1]))
    return {
        "integer_weights": [mixture_mod.integer_weights(w) for w in weight_lists],
        "assign_3_5_7_11": {"datasets": ds4, "draws": ks4},
        "assign_0.7_0.3": {"datasets": ds2, "draws": ks2},
        "assign_5_1_1_2_9_sha256": sha256([ds5, ks5]),
        "assign_far": {"datasets": far_ds, "draws": far_ks},
        "count_3_5_7_11": [m4.count(d, t) for d in range(4) for t in (0, 1, 7, 48, 1001, 10 ** 9)],
    }


class GoldenDataset:
    """What WorkSource needs from a dataset (name, shard_sizes, fingerprint()); no I/O."""

    def __init__(self, name: str, shard_sizes: list[int]):
        self.name, self.shard_sizes = name, list(shard_sizes)

    def fingerprint(self) -> dict:
        return {"name": self.name, "shard_sizes": self.shard_sizes}


GOLDEN_DATASETS = [("web", [100, 57, 143]), ("code", [250]), ("books", [31, 64, 5, 90])]


def _datasets(k: int) -> list[GoldenDataset]:
    return [GoldenDataset(name, sizes) for name, sizes in GOLDEN_DATASETS[:k]]


def _rows(chunk) -> list[list[int]]:
    """A chunk's pointers as rows ``[position, dataset, shard, sample, pass]`` (readable in a diff)."""
    return np.stack([chunk.positions, chunk.dataset_ids, chunk.shard_ids, chunk.sample_idx, chunk.passes], 1).tolist()


def compute_work_source() -> dict:
    """WorkSource.chunk pointers: shuffled endless mixture (several passes), block shuffle with exhaustion "stop"
    (the whole finite stream), and an unshuffled stream."""
    a = source_mod.WorkSource(_datasets(3), [0.5, 0.3, 0.2], seed=1234, canonical_replicas=4, chunk_size=12,
                              shuffle=True, exhaustion="repeat")
    a_chunks = {f"{lane}/{c}": _rows(a.chunk(lane, c)) for lane in range(4) for c in (0, 1, 2, 17, 63, 500)}
    b = source_mod.WorkSource(_datasets(3), [2, 1, 1], seed=7, canonical_replicas=3, chunk_size=20, shuffle=True,
                              shuffle_block_size=50, exhaustion="stop")
    b_chunks = {lane: [_rows(b.chunk(lane, c)) for c in range(b.num_chunks(lane) + 1)] for lane in range(3)}
    c = source_mod.WorkSource(_datasets(2), None, seed=0, canonical_replicas=2, chunk_size=10, shuffle=False,
                              exhaustion="stop")
    return {
        "repeat.lane0.chunk0": a_chunks["0/0"],
        "repeat.lane3.chunk63": a_chunks["3/63"],
        "repeat.sha256": sha256(a_chunks),
        "stop_blocks.total_positions": b.total_positions,
        "stop_blocks.num_chunks": [b.num_chunks(lane) for lane in range(3)],
        "stop_blocks.lane_positions": [b.lane_positions(lane) for lane in range(3)],
        # the last non-empty chunk of each lane (short for one of them), then the whole stream
        "stop_blocks.last_chunks": [b_chunks[lane][-2] for lane in range(3)],
        "stop_blocks.sha256": sha256(b_chunks),
        "unshuffled.total_positions": c.total_positions,
        "unshuffled.lane1.chunk3": _rows(c.chunk(1, 3)),
    }


def _shuffle_records(n: int) -> list[dict]:
    # Non-contiguous positions and some pieces, so identity() uses both of its parts.
    return [{"__src__": (i % 3, i % 2, i, 1000 + 7 * i), "__piece__": i % 4 // 3, "x": i} for i in range(n)]


def compute_shuffle() -> dict:
    """Element identities, Shuffle keys, and the order a shuffle buffer emits fixed records in (push and flush)."""
    probes = [{"__src__": (0, 0, 5, 1234)}, {"__src__": (0, 0, 5, 1234), "__piece__": 2},
              {"__src__": [(99, 1), (100, 0)]}, {"__src__": []}]
    orders = {}
    for buffer_size, seed, lane in ((5, 42, 0), (5, 42, 3), (8, 0, 1)):
        acc = shuffle_mod.Shuffle(buffer_size, seed=seed).new_accumulator(lane)
        pushed = [r["x"] for rec in _shuffle_records(40) for r in acc.push(rec)]
        orders[f"{buffer_size}/{seed}/{lane}"] = {"pushed": pushed, "flushed": [r["x"] for r in acc.flush()]}
    return {
        "identity": [shuffle_mod.identity(r) for r in probes],
        "key": [shuffle_mod.Shuffle(8, seed=42).key, shuffle_mod.Shuffle(8, seed=42).new_accumulator(3).key],
        "orders": orders,
    }


PACK_LENGTHS = [5, 9, 3, 16, 7, 2, 11, 4, 4, 1, 8, 6, 13, 2, 3, 10, 12, 1]


def _pack_rows(method: str) -> list[dict]:
    """Pack documents of PACK_LENGTHS tokens (doc k holds tokens 100k, 100k+1, ...) into rows of 16 tokens."""
    acc = pack_mod.Pack(16, method=method, max_open_bins=3, pad_id=0, label_pad=-100).new_accumulator(0)
    rows = []
    for k, n in enumerate(PACK_LENGTHS):
        doc = {"input_ids": np.arange(100 * k, 100 * k + n, dtype=np.int32), "num_tokens": n,
               "__src__": (0, 0, k, 500 + k), "__piece__": k % 2}
        rows.extend((f"push {k}", r) for r in acc.push(doc))
    rows.extend(("flush", r) for r in acc.flush())
    return [{"emitted": when, **r} for when, r in rows]


def compute_pack() -> dict:
    """Row layout (which document pieces go to which row, when it is emitted), position_ids and cu_seqlens of best
    fit and first fit over the same documents; every field of every row by SHA-256 (dtypes included)."""
    out = {}
    for method in pack_mod.PACK_METHODS:
        rows = _pack_rows(method)
        out[method] = [{"emitted": r["emitted"], "src": r["__src__"], "num_tokens": r["num_tokens"],
                        "cu_seqlens": r["cu_seqlens"], "position_ids": r["position_ids"]} for r in rows]
        out[f"{method}.sha256"] = sha256([{k: [v.dtype.str, v] if isinstance(v, np.ndarray) else v
                                           for k, v in r.items()} for r in rows])
    return out


WORDS = ("alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu nu xi omicron pi rho sigma tau "
         "upsilon").split()
LOADER_STEPS = 4
LOADER_FIELDS = ("input_ids", "labels", "position_ids", "attention_mask", "cu_seqlens", "num_tokens", "__src__")


def _word_level_tokenizer():
    """A fixed-vocabulary word tokenizer (no training, so its ids cannot drift with the tokenizers version)."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {tok: i for i, tok in enumerate(["<pad>", "<eos>", "<unk>", ".", *WORDS])}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    return tok


def _write_corpus(root: Path) -> list[Path]:
    """Two JSONL datasets of fixed texts: "web" (2 shards, 37 + 23 docs) and "code" (1 shard, 41 docs)."""
    dirs = []
    for d, (name, shards) in enumerate((("web", (37, 23)), ("code", (41,)))):
        path = root / name
        path.mkdir(parents=True)
        for s, n in enumerate(shards):
            lines = []
            for i in range(n):
                # 2..32 words: with "." and <eos> some documents pass Tokenize(max_length=24) and split in pieces
                words = [WORDS[(7 * i + (d + 3) * j + s) % len(WORDS)] for j in range(2 + (5 * i + d) % 31)]
                lines.append(json.dumps({"text": " ".join(words) + " .", "id": f"{name}-{s}-{i}"}))
            (path / f"part-{s}.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")
        dirs.append(path)
    return dirs


def compute_loader(workdir) -> dict:
    """A tiny end-to-end run (JSONL, tokenize, pack, shuffle, batch; inline runner, 4 lanes) written under
    ``workdir``: per global step, the SHA-256 of its rows in (lane, micro-batch, row) order; step 0's row sources."""
    import zephon

    dirs = _write_corpus(Path(workdir))
    ops = [zephon.Decode("text"), zephon.Tokenize(_word_level_tokenizer(), eos_id="<eos>", max_length=24),
           zephon.Pack(24), zephon.Shuffle(4, seed=3), zephon.Batch(2)]
    loader = zephon.Loader([zephon.open_dataset(str(d)) for d in dirs], ops, weights=[0.6, 0.4], seed=11,
                           canonical_replicas=4, chunk_size=8, global_batch_size=16, flush_every_k_chunks=2,
                           runner="inline")
    steps: dict[int, list] = {}
    try:
        for mb in loader:
            if mb["__step__"] >= LOADER_STEPS:
                break
            rows = [{k: mb[k][i] for k in LOADER_FIELDS} for i in range(len(mb["input_ids"]))]
            steps.setdefault(mb["__step__"], []).append((mb["__lane__"], mb["__micro__"], rows))
    finally:
        loader.close()
    ordered = {s: [row for _, _, rows in sorted(mbs, key=lambda x: x[:2]) for row in rows] for s, mbs in steps.items()}
    return {
        "steps": sorted(ordered),
        "step_sha256": [sha256(ordered[s]) for s in sorted(ordered)],
        "step0_src": [row["__src__"] for row in ordered.get(0, [])],
    }


def compute_all() -> dict:
    """Every pinned item, as ``GOLDEN`` holds it."""
    with tempfile.TemporaryDirectory() as tmp:
        return {"permutation": plain(compute_permutation()), "mixture": plain(compute_mixture()),
                "work_source": plain(compute_work_source()), "shuffle": plain(compute_shuffle()),
                "pack": plain(compute_pack()), "loader": plain(compute_loader(tmp))}


# ---------------------------------------------------------------- pinned values (see the module docstring)

# Computed with the code of issue 14 (algorithm version 2); see the module docstring before changing any of it.
#: The algorithm version these values belong to: re-pinning GOLDEN means bumping
#: zephon.checkpoint.ALGORITHM_VERSION and this number together.
GOLDEN_ALGORITHM_VERSION = 4
GOLDEN: dict = {'loader': {'step0_src': [[[3, 0]], [[7, 0]], [[3, 1], [6, 0], [34, 0]], [[37, 0]], [[41, 0]],
                          [[14, 0]], [[9, 0]], [[45, 0]], [[51, 0]], [[18, 0]], [[16, 0]],
                          [[49, 0]], [[24, 0], [28, 1]], [[28, 0]], [[57, 0], [59, 1]], [[30, 0]]],
            'step_sha256': ['82d4c1d59bdf8e9bec48f85aa88852b45132b197a77b6b69a68bfda343f52c6e',
                            '1fc367fe69b862b17ef0d7f3c58fc835b0504f7860d9c1ab453a1b2ad1a74455',
                            '5f62dbacf6c1678a13672893833c09fc30495d1c55bb0079be838713ebe6240f',
                            'b44a005950a56b9bf9bb5975aeb212052c6d3d433fbd87312367d1353b70b97e'],
            'steps': [0, 1, 2, 3]},
 'mixture': {'assign_0.7_0.3': {'datasets': [1, 0, 0, 1, 0, 0, 1, 0, 0, 1, 0, 0, 0, 1, 0, 0, 1, 0,
                                             0, 1],
                                'draws': [0, 0, 1, 1, 2, 3, 2, 4, 5, 3, 6, 7, 8, 4, 9, 10, 5, 11,
                                          12, 6]},
             'assign_3_5_7_11': {'datasets': [3, 3, 2, 1, 3, 3, 1, 2, 3, 0, 2, 3, 1, 3, 2, 3, 1, 2,
                                              3, 0, 3, 2, 1, 3, 2, 0, 3, 3, 2, 1, 3, 3, 1, 2, 3, 0,
                                              2, 3, 1, 3, 2, 3, 1, 2, 3, 0, 3, 2],
                                 'draws': [0, 1, 0, 0, 2, 3, 1, 1, 4, 0, 2, 5, 2, 6, 3, 7, 3, 4, 8,
                                           1, 9, 5, 4, 10, 6, 2, 11, 12, 7, 5, 13, 14, 6, 8, 15, 3,
                                           9, 16, 7, 17, 10, 18, 8, 11, 19, 4, 20, 12]},
             'assign_5_1_1_2_9_sha256': 'dd5fe0ecb801e296a60fa8ff7c7572b5d57d463d718a1e16d9e5120ba131ccb9',
             'assign_far': {'datasets': [2, 2, 2],
                            'draws': [555555555556, 640511947003803876, 1281023894007607752]},
             'count_3_5_7_11': [0, 0, 0, 5, 115, 115384615, 0, 0, 2, 9, 193, 192307692, 0, 0, 1, 13,
                                269, 269230769, 0, 1, 4, 21, 424, 423076924],
             'integer_weights': [[1, 1], [734003, 314573], [1, 2, 3], [3, 2],
                                 [104858, 209715, 314573, 419430], [1, 1048576], [1048576, 1]]},
 'pack': {'best_fit': [{'cu_seqlens': [0, 16],
                        'emitted': 'push 3',
                        'num_tokens': 16,
                        'position_ids': [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15],
                        'src': [[503, 1]]},
                       {'cu_seqlens': [0, 5, 14, 16],
                        'emitted': 'push 5',
                        'num_tokens': 16,
                        'position_ids': [0, 1, 2, 3, 4, 0, 1, 2, 3, 4, 5, 6, 7, 8, 0, 1],
                        'src': [[500, 0], [501, 1], [505, 1]]},
                       {'cu_seqlens': [0, 11, 15, 16],
                        'emitted': 'push 9',
                        'num_tokens': 16,
                        'position_ids': [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 0, 1, 2, 3, 0],
                        'src': [[506, 0], [507, 1], [509, 1]]},
                       {'cu_seqlens': [0, 3, 10, 14, 16],
                        'emitted': 'push 13',
                        'num_tokens': 16,
                        'position_ids': [0, 1, 2, 0, 1, 2, 3, 4, 5, 6, 0, 1, 2, 3, 0, 1],
                        'src': [[502, 0], [504, 0], [508, 0], [513, 1]]},
                       {'cu_seqlens': [0, 13, 16],
                        'emitted': 'push 14',
                        'num_tokens': 16,
                        'position_ids': [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 0, 1, 2],
                        'src': [[512, 0], [514, 0]]},
                       {'cu_seqlens': [0, 12, 13],
                        'emitted': 'flush',
                        'num_tokens': 13,
                        'position_ids': [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 0, 0, 0, 0],
                        'src': [[516, 0], [517, 1]]},
                       {'cu_seqlens': [0, 10, 16],
                        'emitted': 'flush',
                        'num_tokens': 16,
                        'position_ids': [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 0, 1, 2, 3, 4, 5],
                        'src': [[515, 1], [511, 1]]},
                       {'cu_seqlens': [0, 8],
                        'emitted': 'flush',
                        'num_tokens': 8,
                        'position_ids': [0, 1, 2, 3, 4, 5, 6, 7, 0, 0, 0, 0, 0, 0, 0, 0],
                        'src': [[510, 0]]}],
          'best_fit.sha256': '22710aa0653cf41be9e4d83af535308684b2d2f084877d14fe891bc35d9b597f',
          'first_fit': [{'cu_seqlens': [0, 16],
                         'emitted': 'push 3',
                         'num_tokens': 16,
                         'position_ids': [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15],
                         'src': [[503, 1]]},
                        {'cu_seqlens': [0, 5, 14, 16],
                         'emitted': 'push 5',
                         'num_tokens': 16,
                         'position_ids': [0, 1, 2, 3, 4, 0, 1, 2, 3, 4, 5, 6, 7, 8, 0, 1],
                         'src': [[500, 0], [501, 1], [505, 1]]},
                        {'cu_seqlens': [0, 3, 10, 14, 15],
                         'emitted': 'push 12',
                         'num_tokens': 15,
                         'position_ids': [0, 1, 2, 0, 1, 2, 3, 4, 5, 6, 0, 1, 2, 3, 0, 0],
                         'src': [[502, 0], [504, 0], [507, 1], [509, 1]]},
                        {'cu_seqlens': [0, 8, 14, 16],
                         'emitted': 'push 13',
                         'num_tokens': 16,
                         'position_ids': [0, 1, 2, 3, 4, 5, 6, 7, 0, 1, 2, 3, 4, 5, 0, 1],
                         'src': [[510, 0], [511, 1], [513, 1]]},
                        {'cu_seqlens': [0, 13, 16],
                         'emitted': 'push 14',
                         'num_tokens': 16,
                         'position_ids': [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 0, 1, 2],
                         'src': [[512, 0], [514, 0]]},
                        {'cu_seqlens': [0, 11, 15, 16],
                         'emitted': 'push 17',
                         'num_tokens': 16,
                         'position_ids': [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 0, 1, 2, 3, 0],
                         'src': [[506, 0], [508, 0], [517, 1]]},
                        {'cu_seqlens': [0, 12],
                         'emitted': 'flush',
                         'num_tokens': 12,
                         'position_ids': [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 0, 0, 0, 0],
                         'src': [[516, 0]]},
                        {'cu_seqlens': [0, 10],
                         'emitted': 'flush',
                         'num_tokens': 10,
                         'position_ids': [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 0, 0, 0, 0, 0, 0],
                         'src': [[515, 1]]}],
          'first_fit.sha256': '7c7b9ba1f1a3e19dbf038d627a434bff1fd996c45a919e690738418d3e6f21a5'},
 'permutation': {'derive_key': [11243728523470438572, 8183571696633415487, 2968770259833958387,
                                10537169234660230318, 16951891705880331270],
                 'mix64': [0, 6238072747940578789, 15839785061582574730, 5622224078331092714,
                           2720858781877447050, 13029008266876403067],
                 'perm_1000003_sampled': [770024, 166014, 844929, 95219, 474974, 332348],
                 'perm_1000_head': [9, 805, 319, 617, 391, 439, 831, 252, 387, 955, 647, 114, 175,
                                    708, 269, 796],
                 'perm_1000_sha256': 'd8df3ab0f2cd065c746f596b5c1f2f0fc826b8d46df3b94cc21e7e184c9137bc',
                 'perm_scalar': 169,
                 'perm_small': {'1': [0],
                                '10': [9, 4, 0, 6, 8, 7, 3, 2, 1, 5],
                                '17': [3, 2, 6, 9, 4, 1, 5, 13, 15, 0, 8, 16, 14, 11, 10, 7, 12],
                                '2': [1, 0],
                                '3': [0, 2, 1],
                                '5': [1, 2, 3, 0, 4]}},
 'shuffle': {'identity': [80871424, 80871426, 6488065, -65536],
             'key': [10537169234660230318, 2571863145693867430],
             'orders': {'5/42/0': {'flushed': [27, 36, 39, 38, 33],
                                   'pushed': [0, 2, 3, 1, 4, 8, 5, 6, 10, 12, 9, 7, 11, 13, 15, 17,
                                              19, 14, 20, 22, 23, 25, 26, 21, 16, 28, 30, 24, 32,
                                              29, 18, 35, 34, 31, 37]},
                        '5/42/3': {'flushed': [36, 39, 33, 38, 31],
                                   'pushed': [2, 4, 1, 6, 0, 7, 10, 8, 5, 12, 11, 15, 13, 9, 3, 14,
                                              20, 18, 19, 16, 22, 17, 26, 23, 28, 25, 27, 21, 29,
                                              32, 34, 24, 35, 30, 37]},
                        '8/0/1': {'flushed': [26, 23, 35, 37, 39, 32, 38, 36],
                                  'pushed': [3, 1, 0, 2, 5, 7, 12, 14, 6, 16, 4, 18, 8, 20, 21, 9,
                                             11, 15, 24, 10, 17, 25, 13, 19, 29, 22, 30, 34, 28, 31,
                                             33, 27]}}},
 'work_source': {'repeat.lane0.chunk0': [[0, 2, 2, 1, 0], [1, 0, 1, 5, 0], [2, 1, 0, 63, 0],
                                         [3, 0, 1, 9, 0], [4, 2, 2, 4, 0], [5, 0, 1, 49, 0],
                                         [6, 1, 0, 216, 0], [7, 0, 1, 14, 0], [8, 1, 0, 74, 0],
                                         [9, 0, 1, 30, 0], [10, 2, 2, 0, 0], [11, 0, 1, 46, 0]],
                 'repeat.lane3.chunk63': [[3060, 2, 3, 18, 3], [3061, 0, 0, 38, 5],
                                          [3062, 1, 0, 129, 3], [3063, 0, 0, 23, 5],
                                          [3064, 2, 3, 48, 3], [3065, 0, 0, 32, 5],
                                          [3066, 1, 0, 41, 3], [3067, 0, 0, 50, 5],
                                          [3068, 1, 0, 128, 3], [3069, 0, 0, 52, 5],
                                          [3070, 2, 3, 50, 3], [3071, 0, 0, 19, 5]],
                 'repeat.sha256': '551b123236fe237504287d1dc0b7aecc32dc8743c364e51dd146f3aa54a8c8dc',
                 'stop_blocks.lane_positions': [201, 200, 200],
                 'stop_blocks.last_chunks': [[[600, 2, 3, 81, 0]],
                                             [[560, 2, 3, 47, 0], [561, 0, 2, 117, 0],
                                              [562, 1, 0, 134, 0], [563, 0, 2, 134, 0],
                                              [564, 2, 3, 30, 0], [565, 0, 2, 130, 0],
                                              [566, 1, 0, 133, 0], [567, 0, 2, 123, 0],
                                              [568, 2, 3, 33, 0], [569, 0, 2, 120, 0],
                                              [570, 1, 0, 108, 0], [571, 0, 2, 113, 0],
                                              [572, 2, 3, 43, 0], [573, 0, 2, 100, 0],
                                              [574, 1, 0, 144, 0], [575, 0, 2, 106, 0],
                                              [576, 2, 3, 23, 0], [577, 0, 2, 94, 0],
                                              [578, 1, 0, 126, 0], [579, 0, 2, 116, 0]],
                                             [[580, 2, 3, 20, 0], [581, 0, 2, 112, 0],
                                              [582, 1, 0, 131, 0], [583, 0, 2, 135, 0],
                                              [584, 2, 3, 11, 0], [585, 0, 2, 99, 0],
                                              [586, 1, 0, 135, 0], [587, 0, 2, 108, 0],
                                              [588, 2, 3, 13, 0], [589, 0, 2, 140, 0],
                                              [590, 1, 0, 139, 0], [591, 0, 2, 93, 0],
                                              [592, 2, 3, 45, 0], [593, 0, 2, 107, 0],
                                              [594, 1, 0, 121, 0], [595, 0, 2, 127, 0],
                                              [596, 2, 3, 14, 0], [597, 0, 2, 109, 0],
                                              [598, 1, 0, 113, 0], [599, 0, 2, 141, 0]]],
                 'stop_blocks.num_chunks': [11, 10, 10],
                 'stop_blocks.sha256': 'df9865688c20a09599d97d76f4eb110da2279e715d8237fced57f66224bcad67',
                 'stop_blocks.total_positions': 601,
                 'unshuffled.lane1.chunk3': [[70, 1, 0, 35, 0], [71, 0, 0, 35, 0],
                                             [72, 1, 0, 36, 0], [73, 0, 0, 36, 0],
                                             [74, 1, 0, 37, 0], [75, 0, 0, 37, 0],
                                             [76, 1, 0, 38, 0], [77, 0, 0, 38, 0],
                                             [78, 1, 0, 39, 0], [79, 0, 0, 39, 0]],
                 'unshuffled.total_positions': 500}
}


# ---------------------------------------------------------------- the checks


@pytest.mark.parametrize("item", ["permutation", "mixture", "work_source", "shuffle", "pack"])
def test_golden(item):
    mismatches = golden_mismatches(item, plain(globals()[f"compute_{item}"]()))
    assert not mismatches, _explain(mismatches)


def test_golden_values_belong_to_the_current_algorithm_version():
    from zephon.checkpoint import ALGORITHM_VERSION

    assert ALGORITHM_VERSION == GOLDEN_ALGORITHM_VERSION, (
        "ALGORITHM_VERSION changed: re-pin GOLDEN with the new algorithms and set GOLDEN_ALGORITHM_VERSION to match")


def test_checkpoint_of_another_algorithm_version_is_refused_naming_both(tmp_path, monkeypatch):
    import zephon.checkpoint as ckpt
    from zephon import Batch, CheckpointError, Decode, Loader, open_dataset

    (tmp_path / "d.jsonl").write_text("".join(f'{{"text": "t{i}"}}\n' for i in range(40)))
    ds = [open_dataset(str(tmp_path / "d.jsonl"))]
    old = Loader(ds, [Decode("text"), Batch(1)], canonical_replicas=2, chunk_size=4, runner="inline")
    state = old.checkpoint()
    monkeypatch.setattr(ckpt, "ALGORITHM_VERSION", ckpt.ALGORITHM_VERSION + 1)  # a later Zephon
    new = Loader(ds, [Decode("text"), Batch(1)], canonical_replicas=2, chunk_size=4, runner="inline")
    with pytest.raises(CheckpointError, match=rf"algorithm version {ckpt.ALGORITHM_VERSION - 1}\b.*"
                                              rf"runs version {ckpt.ALGORITHM_VERSION}\b"):
        new.restore(state)


def test_golden_loader(tmp_path):
    mismatches = golden_mismatches("loader", plain(compute_loader(tmp_path)))
    assert not mismatches, _explain(mismatches)


def _explain(mismatches: list[str]) -> str:
    return ("a pinned algorithm output changed, so a checkpoint made before this change would restore onto a "
            "different stream. If intended: bump the algorithm version in the config fingerprint and re-pin GOLDEN "
            "(python tests/test_golden.py).\n" + "\n".join(mismatches))


# One-bit changes of each pinned algorithm. Each entry: (item, what changes, patch(monkeypatch)).


def _xor_key(fn):
    return lambda *parts: fn(*parts) ^ 1


def _bresenham_shifted(self, node, i):
    """Mixture's split (the left side's share of the first ``i`` positions) with the line's phase moved by one
    (an off-by-one tie-break)."""
    return (i * node["wl"] + 1) // node["w"]


def _first_fit(self, n):
    for bid in self.bins:
        if self.room[bid] >= n:
            return bid
    return None


def _xor_first_pointer(pointers):
    def changed(self, lane, chunk_id, positions):
        out = pointers(self, lane, chunk_id, positions)
        if len(out):
            out.sample_idx[0] ^= 1
        return out
    return changed


def _xor_first_token(emit):
    def changed(self, bid):
        row = emit(self, bid)
        row["input_ids"][0] ^= 1
        return row
    return changed


def _alt_identity(record):
    src = record["__src__"]
    if isinstance(src, list):
        position, piece = src[0] if src else (-1, 0)
    else:
        position, piece = src[3], record.get("__piece__", 0)
    return (int(position) << 17) + int(piece)  # 17 instead of 16


BIT_FLIPS = [
    ("permutation", "mix64 multiplier _M1 with its lowest bit flipped",
     lambda mp: mp.setattr(permute, "_M1", np.uint64(int(permute._M1) ^ 1))),
    ("permutation", "3 Feistel rounds instead of 4", lambda mp: mp.setattr(permute, "_ROUNDS", 3)),
    ("permutation", "derive_key xor 1", lambda mp: mp.setattr(permute, "derive_key", _xor_key(permute.derive_key))),
    ("mixture", "Bresenham phase shifted by one",
     lambda mp: (mp.setattr(mixture_mod.Mixture, "_split", _bresenham_shifted),
                 mp.setattr(mixture_mod.Mixture, "_split_many", _bresenham_shifted))),
    ("mixture", "weights rounded to 2**-21 instead of 2**-20", lambda mp: mp.setattr(mixture_mod, "_SCALE", 1 << 21)),
    ("work_source", "shuffle keys salted (derive_key xor 1)",
     lambda mp: mp.setattr(source_mod, "derive_key", _xor_key(source_mod.derive_key))),
    ("work_source", "one sample index xor 1",
     lambda mp: mp.setattr(source_mod.WorkSource, "pointers", _xor_first_pointer(source_mod.WorkSource.pointers))),
    ("work_source", "mix64 multiplier _M2 with its lowest bit flipped",
     lambda mp: mp.setattr(permute, "_M2", np.uint64(int(permute._M2) ^ 1))),
    ("shuffle", "a different hash seed (derive_key xor 1)",
     lambda mp: mp.setattr(shuffle_mod, "derive_key", _xor_key(shuffle_mod.derive_key))),
    ("shuffle", "identity shifts the position by 17 bits", lambda mp: mp.setattr(shuffle_mod, "identity",
                                                                                 _alt_identity)),
    ("pack", "first fit where best fit was asked", lambda mp: mp.setattr(pack_mod.PackAccumulator, "_find",
                                                                         _first_fit)),
    ("pack", "one token xor 1", lambda mp: mp.setattr(pack_mod.PackAccumulator, "_emit",
                                                      _xor_first_token(pack_mod.PackAccumulator._emit))),
    ("loader", "work source keys salted (derive_key xor 1)",
     lambda mp: mp.setattr(source_mod, "derive_key", _xor_key(source_mod.derive_key))),
    ("loader", "first fit where best fit was asked", lambda mp: mp.setattr(pack_mod.PackAccumulator, "_find",
                                                                           _first_fit)),
    ("loader", "a different shuffle seed (derive_key xor 1)",
     lambda mp: mp.setattr(shuffle_mod, "derive_key", _xor_key(shuffle_mod.derive_key))),
]


@pytest.mark.parametrize("item,change,patch", BIT_FLIPS, ids=[f"{i}: {c}" for i, c, _ in BIT_FLIPS])
def test_golden_check_can_fail(item, change, patch, monkeypatch, tmp_path):
    """The golden comparison reports a mismatch when the algorithm behind ``item`` changes by one bit."""
    patch(monkeypatch)
    compute = globals()[f"compute_{item}"]
    actual = compute(tmp_path) if item == "loader" else compute()
    assert golden_mismatches(item, plain(actual)), f"{change}: not detected"


def test_every_item_is_pinned_and_can_fail():
    """Each pinned item has a compute function, a golden value and at least one one-bit change."""
    items = {"permutation", "mixture", "work_source", "shuffle", "pack", "loader"}
    assert set(GOLDEN) == items
    assert {i for i, _, _ in BIT_FLIPS} == items
    assert all(callable(globals().get(f"compute_{i}")) for i in items)


def golden_literal(values: dict) -> str:
    """``values`` as the Python source of the GOLDEN literal (lines of at most 120 characters)."""
    import pprint

    lines = ["GOLDEN: dict = {"]
    for item in sorted(values):
        prefix = f"    {item!r}: "
        body = pprint.pformat(values[item], width=119 - len(prefix), sort_dicts=True, compact=True)
        lines.append(prefix + body.replace("\n", "\n" + " " * len(prefix)) + ",")
    return "\n".join(lines + ["}"])


if __name__ == "__main__":  # re-pin: print the current values as the GOLDEN literal
    print(golden_literal(compute_all()))
