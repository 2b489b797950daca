"""Zephon for Megatron-LM users of Energon: swap ``megatron.energon`` for ``zephon_energon``.

Same entry points and keywords as megatron-energon 7.4 (``get_train_dataset``, ``get_val_dataset(s)``,
``WorkerConfig``, ``get_loader``, ``get_savable_loader`` with ``save_state_rank`` /
``restore_state_rank`` / ``save_state_global`` / ``restore_state_global``), the same samples
(Energon's own ``TextSample``, ``CaptioningSample``, ... and crude dicts) and an unchanged
``TaskEncoder``; the data order comes from Zephon's lanes, so the loader state is plain JSON data that
restores at another world size and another ``num_workers``. See docs/energon.md.
"""
from megatron.energon import (  # noqa: F401  (re-exported: one import line to change)
    Batch,
    CaptioningSample,
    Cooker,
    CrudeSample,
    DefaultTaskEncoder,
    ImageClassificationSample,
    ImageSample,
    InterleavedSample,
    MultiChoiceVQASample,
    OCRSample,
    Sample,
    SimilarityInterleavedSample,
    SkipSample,
    TaskEncoder,
    TextSample,
    VidQASample,
    VQASample,
    WorkerConfig,
    basic_sample_keys,
    batch_list,
    batch_pad_stack,
    batch_stack,
    cooker,
    edataclass,
    generic_batch,
    stateless,
)

from .dataset import (DEFAULT_CANONICAL_REPLICAS, EnergonDataset, RefusedKeyword, ZephonEnergonWarning,
                      get_train_dataset, get_val_dataset, get_val_datasets)
from .loader import BasicDataLoader, SavableDataLoader, get_loader, get_savable_loader
from .wrappers import LimitDataset, RepeatDataset

__all__ = [
    "DEFAULT_CANONICAL_REPLICAS", "BasicDataLoader", "Batch", "CaptioningSample", "Cooker", "CrudeSample",
    "DefaultTaskEncoder", "EnergonDataset", "ImageClassificationSample", "ImageSample", "InterleavedSample",
    "LimitDataset", "MultiChoiceVQASample", "OCRSample", "RefusedKeyword", "RepeatDataset", "Sample",
    "SavableDataLoader",
    "SimilarityInterleavedSample", "SkipSample", "TaskEncoder", "TextSample", "VQASample", "VidQASample",
    "WorkerConfig", "ZephonEnergonWarning", "basic_sample_keys", "batch_list", "batch_pad_stack", "batch_stack",
    "cooker", "edataclass", "generic_batch", "get_loader", "get_savable_loader", "get_train_dataset",
    "get_val_dataset", "get_val_datasets", "stateless",
]
