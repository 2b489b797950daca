"""Every name Megatron-LM's examples and megatron-bridge's Energon data module import from ``megatron.energon``
is importable after the swap ``sys.modules["megatron.energon"] = zephon_energon`` (docs/energon.md), and is
either Energon's own object (sample types, TaskEncoder helpers, utilities: the same object, so user code
sees no difference), zephon_energon's translation (loaders, datasets, wrappers), or refused at call time
with a message naming it and the alternative.

The fixture NAMES was read from the sources (``from megatron.energon... import ...`` statements) of
NVIDIA/Megatron-LM examples/multimodal and examples/mimo (commit d98e8a64) and NVIDIA-NeMo/Megatron-Bridge
src/megatron/bridge/data/energon (commit 067f987d). A name missing from zephon_energon fails the test.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

pytest.importorskip("torch")
me = pytest.importorskip("megatron.energon")

import zephon_energon as ze  # noqa: E402
from zephon_energon import RefusedKeyword  # noqa: E402

MLM_MM = "Megatron-LM examples/multimodal"
MLM_MIMO = "Megatron-LM examples/mimo"
BRIDGE = "Megatron-Bridge src/megatron/bridge/data/energon"

# (module imported from, name, who imports it, what it is after the swap): "zephon" = zephon_energon's own
# translation; "energon" = Energon's object itself (re-exported, or Energon's submodule through the swap).
NAMES = [
    ("megatron.energon", "Batch", [MLM_MM, BRIDGE], "energon"),
    ("megatron.energon", "CaptioningSample", [MLM_MM], "energon"),
    ("megatron.energon", "DefaultTaskEncoder", [MLM_MM, MLM_MIMO, BRIDGE], "energon"),
    ("megatron.energon", "LimitDataset", [MLM_MM], "zephon"),
    ("megatron.energon", "MultiChoiceVQASample", [MLM_MM], "energon"),
    ("megatron.energon", "OCRSample", [MLM_MM], "energon"),
    ("megatron.energon", "RepeatDataset", [MLM_MM], "zephon"),
    ("megatron.energon", "Sample", [MLM_MM, BRIDGE], "energon"),
    ("megatron.energon", "SimilarityInterleavedSample", [MLM_MM], "energon"),
    ("megatron.energon", "VQASample", [MLM_MM, MLM_MIMO], "energon"),
    ("megatron.energon", "WorkerConfig", [MLM_MM, MLM_MIMO, BRIDGE], "energon"),
    ("megatron.energon", "get_loader", [MLM_MM, MLM_MIMO], "zephon"),
    ("megatron.energon", "get_savable_loader", [MLM_MM, BRIDGE], "zephon"),
    ("megatron.energon", "get_train_dataset", [MLM_MM, MLM_MIMO, BRIDGE], "zephon"),
    ("megatron.energon", "get_val_datasets", [MLM_MM], "zephon"),
    ("megatron.energon.task_encoder.base", "stateless", [MLM_MM, MLM_MIMO], "energon"),
    ("megatron.energon.epathlib.epath", "EPath", [BRIDGE], "energon"),
    ("megatron.energon.flavors.base_dataset", "Sample", [BRIDGE], "energon"),
    ("megatron.energon.flavors.webdataset", "DefaultDecoderWebdatasetFactory", [BRIDGE], "energon"),
    ("megatron.energon.flavors.webdataset.base_webdataset", "BaseWebdatasetFactory", [BRIDGE], "energon"),
]

_PROBE = r"""
import importlib, json, sys
import zephon_energon
real = {m: mod for m, mod in sys.modules.items() if m == "megatron.energon" or m.startswith("megatron.energon.")}
sys.modules["megatron.energon"] = zephon_energon  # the swap a Megatron-LM user makes
out = []
for module, name in json.loads(sys.argv[1]):
    try:
        obj = getattr(importlib.import_module(module), name)
    except Exception as e:
        out.append([module, name, "missing", f"{type(e).__name__}: {e}"])
        continue
    src = real.get(module) if module != "megatron.energon" else real["megatron.energon"]
    same = src is not None and getattr(src, name, None) is obj
    owner = getattr(obj, "__module__", "") or ""
    out.append([module, name, "zephon" if owner.startswith("zephon_energon") else "energon" if same else "other",
                owner])
print(json.dumps(out))
"""


def test_every_name_the_megatron_examples_import_resolves_after_the_swap():
    """A fresh interpreter imports zephon_energon, swaps it in, then imports each name as the examples do."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
    out = subprocess.run([sys.executable, "-c", _PROBE, json.dumps([[m, n] for m, n, _, _ in NAMES])],
                         capture_output=True, text=True, timeout=300, env=env)
    assert out.returncode == 0, out.stderr[-2000:]
    got = {(m, n): (kind, owner) for m, n, kind, owner in json.loads(out.stdout.strip().splitlines()[-1])}
    wrong = {f"{m}.{n}": got[(m, n)] for m, n, _, want in NAMES if got[(m, n)][0] != want}
    assert not wrong, f"not what the fixture says (kind, module): {wrong}"


def test_top_level_names_are_in_zephon_energon_all():
    top = {n for m, n, _, _ in NAMES if m == "megatron.energon"}
    assert top <= set(ze.__all__), sorted(top - set(ze.__all__))


# -- LimitDataset / RepeatDataset: work as Energon's or are refused, naming themselves and the alternative ------
@pytest.fixture(scope="module")
def text_root(tmp_path_factory):
    from energon_data import text_dataset

    return text_dataset(str(tmp_path_factory.mktemp("names")))[0]


def _keys(dl):
    return [list(b.__key__) for b in dl]


def test_limit_dataset_caps_validation_batches_like_energon(text_root):
    """Energon's own LimitDataset over its own val dataset is the oracle: same batches, each iter() restarting."""
    for length in (2, 5):  # below and above the split's 3 batches
        batches = []
        for lib in (me, ze):
            wc = lib.WorkerConfig(rank=0, world_size=1, num_workers=0)
            (val, _src), = lib.get_val_datasets(text_root, worker_config=wc, batch_size=2)
            dl = lib.get_loader(lib.LimitDataset(val, length=length, worker_config=wc, reset_after_epoch=True))
            batches.append([_keys(dl), _keys(dl)])
        ref, got = batches
        assert got == ref, length
        assert len(got[0]) == min(length, 3) and got[0] == got[1]  # the val split holds 6 samples: 3 batches
    wc = ze.WorkerConfig(rank=0, world_size=1, num_workers=0)
    (val, _src), = ze.get_val_datasets(text_root, worker_config=wc, batch_size=2)
    assert _keys(ze.get_loader(ze.LimitDataset(val, length=0, worker_config=wc))) == []  # Energon's: nothing


def test_repeat_dataset_passes_an_endless_training_dataset_and_refuses_the_rest(text_root):
    wc = ze.WorkerConfig(rank=0, world_size=1, num_workers=0)
    train = ze.get_train_dataset(text_root, worker_config=wc, batch_size=2, shuffle_buffer_size=None,
                                 max_samples_per_sequence=None, canonical_replicas=2)
    assert ze.RepeatDataset(train, worker_config=wc) is train
    (val, _src), = ze.get_val_datasets(text_root, worker_config=wc, batch_size=2)
    with pytest.raises(RefusedKeyword, match=r"RepeatDataset: over a validation dataset.*LimitDataset"):
        ze.RepeatDataset(val, worker_config=wc)
    with pytest.raises(RefusedKeyword, match=r"RepeatDataset: repeats=2 .*repeat=True"):
        ze.RepeatDataset(ze.get_train_dataset(text_root, worker_config=wc, batch_size=2, shuffle_buffer_size=None,
                                              max_samples_per_sequence=None, canonical_replicas=2, repeat=False),
                         repeats=2, worker_config=wc)
    with pytest.raises(RefusedKeyword, match=r"LimitDataset: over a training dataset.*--train-iters"):
        ze.LimitDataset(train, 3, worker_config=wc)


def test_a_python_dataset_class_in_dataset_yaml_is_refused_naming_it(tmp_path):
    """megatron-bridge subclasses DefaultDecoderWebdatasetFactory (ChatMLWebdataset) and names it in dataset.yaml:
    zephon_energon cannot run that class, so get_train_dataset refuses, naming the class, the file and what to do."""
    from energon_data import energon_prepare, write_text_tars

    root = str(tmp_path / "chatml")
    write_text_tars(root, shards=1, per_shard=4)
    energon_prepare(root, {"train": r".*"}, dataset_yaml={
        "__module__": "megatron.bridge.data.energon.task_encoder_utils", "__class__": "ChatMLWebdataset",
        "field_map": {"text": "txt"}})
    wc = ze.WorkerConfig(rank=0, world_size=1, num_workers=0)
    with pytest.raises(RefusedKeyword, match=r"dataset class 'ChatMLWebdataset'.*chatml.*CrudeWebdataset"):
        ze.get_train_dataset(root, worker_config=wc, batch_size=2, shuffle_buffer_size=None,
                             max_samples_per_sequence=None, canonical_replicas=2)
