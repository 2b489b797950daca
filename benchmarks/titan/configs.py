"""TorchTitan ``--module`` for the baseline: its debug job with its own ``HuggingFaceTextDataLoader``.

``--module benchmarks.titan.configs --config titan_hf_debugmodel --dataloader.dataset_path DIR`` reads
the ``*.jsonl`` files of DIR through ``datasets.load_dataset("json")``, registered the way TorchTitan
documents adding a dataset (an entry in ``torchtitan.hf_datasets.text_datasets.DATASETS``). Its state is
TorchTitan's ``ParallelAwareDataloader`` state: one pickled entry per dp rank plus ``world_size``.
"""
from __future__ import annotations

import glob
import os

from torchtitan.hf_datasets import DatasetConfig
from torchtitan.hf_datasets import text_datasets
from torchtitan.hf_datasets.text_datasets import HuggingFaceTextDataLoader
from torchtitan.models.llama3.config_registry import llama3_debugmodel
from torchtitan.trainer import Trainer

#: The dataset name this module registers with TorchTitan.
DATASET = "local_jsonl"


def _load(path: str):
    """Every ``*.jsonl`` under ``path`` (sorted) as one map-style ``datasets.Dataset``."""
    from datasets import load_dataset

    files = sorted(glob.glob(os.path.join(path, "**", "*.jsonl"), recursive=True))
    if not files:
        raise FileNotFoundError(f"no *.jsonl files under {path!r} (--dataloader.dataset_path)")
    return load_dataset("json", data_files=files, split="train")


text_datasets.DATASETS[DATASET] = DatasetConfig(path="", loader=_load, sample_processor=lambda s: s["text"])


def titan_hf_debugmodel() -> Trainer.Config:
    """TorchTitan's ``llama3_debugmodel`` with its HF text loader over local JSONL, validator off."""
    config = llama3_debugmodel()
    config.dataloader = HuggingFaceTextDataLoader.Config(dataset=DATASET)
    config.validator.enable = False
    return config
