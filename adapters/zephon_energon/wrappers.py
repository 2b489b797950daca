"""Energon's dataset wrappers that Megatron-LM's examples import: ``LimitDataset`` and ``RepeatDataset``.

They translate onto what a Zephon dataset already has (a validation ``limit``; an endless training stream)
or refuse at call time, naming the wrapper and what to use instead. See docs/energon.md.
"""
from __future__ import annotations

import copy

from .keywords import refuse
from .pipeline import EnergonDataset


def _dataset(name: str, dataset) -> EnergonDataset:
    if not isinstance(dataset, EnergonDataset):
        raise TypeError(f"{name}: expected a dataset from zephon_energon's get_train_dataset / get_val_dataset(s), "
                        f"got {type(dataset).__name__}")
    return dataset


def LimitDataset(dataset, length: int, *, reset_after_epoch: bool = False, worker_config=None):  # noqa: N802
    """Energon's ``LimitDataset`` over a validation dataset: at most ``length`` batches per rank and ``iter()``,
    then the split starts again (Energon resets the inner dataset at the end of every limited epoch, whatever
    ``reset_after_epoch`` says; so does this).

    dataset: from ``get_val_dataset(s)``. length: batches per rank and iteration (>= 0).
    reset_after_epoch, worker_config: accepted as Energon takes them.
    Returns the dataset with that limit (it replaces the dataset: iterate the result only).
    Raises ``RefusedKeyword`` for a training dataset, ``ValueError`` for a bad length."""
    ds = _dataset("LimitDataset", dataset)
    if ds.training:
        refuse("LimitDataset", "over a training dataset: zephon_energon's training stream is endless and elastic; "
               "bound the run by Megatron's --train-iters, or give get_train_dataset virtual_epoch_length= "
               "for epochs of that many batches")
    if not isinstance(length, int) or length < 0:
        raise ValueError(f"LimitDataset: length must be an int >= 0, got {length!r}")
    out = copy.copy(ds)
    out.limit = length
    return out


def RepeatDataset(dataset, *, repeats=None, restart: bool = True, worker_config=None):  # noqa: N802
    """Energon's ``RepeatDataset``: a training dataset built with ``repeat=True`` (the default) is already
    endless, so ``repeats=None`` returns it unchanged; everything else is refused.

    dataset: from zephon_energon. repeats: None (endless). restart, worker_config: accepted as Energon takes them.
    Raises ``RefusedKeyword`` naming the alternative: a validation split is not repeated (each evaluation
    restarts it: ``LimitDataset(val_ds, length=...)`` or ``get_val_datasets(..., limit=...)``), a counted number
    of repeats is the metadataset's ``repetitions`` or ``repeat=True``."""
    ds = _dataset("RepeatDataset", dataset)
    if repeats is None and ds.training and ds.plan.source.exhaustion == "repeat":
        return ds
    if not ds.training:
        refuse("RepeatDataset", "over a validation dataset: zephon_energon does not repeat a validation split; "
               "each evaluation starts it again. Use LimitDataset(val_ds, length=n) or get_val_datasets(..., "
               "limit=n) (n batches per rank, fewer when the split is shorter), or zephon_energon.megatron's "
               "train_valid_test_dataloaders_provider for Megatron-LM")
    refuse("RepeatDataset", f"repeats={repeats!r} over a training dataset built with repeat=False: use repeat=True "
           f"(an endless stream, every pass shuffled anew) or a metadataset's repetitions")
