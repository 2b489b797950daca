"""A Megatron-LM data provider with the shape of ``examples/multimodal/dataloader_provider.py``.

Drop-in for that file's ``train_valid_test_dataloaders_provider``: train / valid / test loaders from
an Energon-prepared dataset (or metadataset) through ``zephon_energon``, and an ``EnergonDataloader``
whose ``save_state()`` returns this rank's state (what Megatron-LM's ``maybe_save_dataloader_state``
writes to ``train_dataloader_dprank{dp_rank:03d}.pt``). Restoring differs on purpose:

* each rank reads only the ``train_dataloader_dprank*.pt`` files of the iteration whose ranks held the lanes it
  now owns (``zephon.host.rank_entries_needed``: at most ceil(saved / new) + 1 files; ``torch.load(...,
  weights_only=True)``: the state is JSON data) and merges them, so the run resumes at another data-parallel
  size or worker count;
* a state that cannot be applied (another dataset or config, lanes missing, an unreadable file, no
  file when resuming from iteration > 0) raises instead of silently starting from the beginning.

Outside a Megatron-LM process pass ``args`` (with ``data_path``, ``micro_batch_size``, ``num_workers``,
``load``, ``dataloader_save``, ``iteration``, ``eval_iters``, ``packing_buffer_size``, optional
``canonical_replicas``) and ``dp_rank`` / ``dp_world_size``.
"""
from __future__ import annotations

import glob
import os
import re

import torch

from zephon import CheckpointError
from zephon.host import rank_entries_needed

from . import WorkerConfig, get_loader, get_savable_loader, get_train_dataset, get_val_datasets


def _megatron_args(args):
    if args is not None:
        return args
    from megatron.training import get_args  # a Megatron-LM process
    return get_args()


def _dp(dp_rank, dp_world_size, group):
    if dp_rank is not None:
        return dp_rank, dp_world_size, group
    from megatron.core import parallel_state
    return (parallel_state.get_data_parallel_rank(), parallel_state.get_data_parallel_world_size(),
            parallel_state.get_data_parallel_group())


def checkpoint_name(save_dir: str, iteration: int, dp_rank: int) -> str:
    """Where Megatron-LM's ``maybe_save_dataloader_state`` writes a rank's state (tensor rank 0, no
    pipeline parallelism): ``<dir>/iter_<iteration:07d>/mp_rank_00/train_dataloader_dprank<r:03d>.pt``."""
    try:
        from megatron.training.checkpointing import get_checkpoint_name
    except ImportError:
        return default_checkpoint_name(save_dir, iteration, dp_rank)
    return get_checkpoint_name(save_dir, iteration, pipeline_parallel=False, tensor_rank=0, pipeline_rank=0,
                               expert_parallel=False, expert_rank=0,
                               basename=f"train_dataloader_dprank{dp_rank:03d}.pt")


def default_checkpoint_name(save_dir: str, iteration: int, dp_rank: int) -> str:
    """``checkpoint_name`` where ``megatron.training`` is not importable: the same path, spelled out
    (tests/test_megatron_contract.py checks both against megatron-core's files)."""
    return os.path.join(save_dir, f"iter_{iteration:07d}", "mp_rank_00", f"train_dataloader_dprank{dp_rank:03d}.pt")


def load_saved_states(save_dir: str, iteration: int, *, rank: int | None = None, world_size: int | None = None,
                      plan=None) -> list:
    """The data-parallel ranks' saved states of ``iteration`` (any old world size) that rank ``rank`` of
    ``world_size`` needs, read with ``weights_only=True``: only the files of the old ranks holding the lanes it
    owns in ``plan`` (the train dataset's ``plan``: ``canonical_replicas``, ``lane_assignment``), or every
    file when ``rank`` is None. The saved world size is the number of files (named by Megatron-LM, listed
    without reading them). Raises ``FileNotFoundError`` when there is none, ``CheckpointError`` when a
    file is not a Zephon state or ranks are missing from the sequence 0..n-1."""
    folder = os.path.dirname(checkpoint_name(save_dir, iteration, 0))
    files = sorted(glob.glob(os.path.join(folder, "train_dataloader_dprank*.pt")))
    if not files:
        raise FileNotFoundError(f"no data loader state train_dataloader_dprank*.pt in {folder}: resuming iteration "
                                f"{iteration} would restart the data from the beginning; refusing")
    ranks = [int(re.search(r"dprank(\d+)\.pt$", f).group(1)) for f in files]
    if ranks != list(range(len(ranks))):
        raise CheckpointError(f"data loader states in {folder} are for ranks {ranks}: some of 0..{max(ranks)} missing")
    if rank is not None:
        files = [files[r] for r in rank_entries_needed(
            len(files), world_size, rank, plan.canonical_replicas, saved_assignment=plan.lane_assignment,
            new_assignment=plan.lane_assignment)]
    states = []
    for f in files:
        try:
            obj = torch.load(f, map_location="cpu", weights_only=True)
        except Exception as e:
            raise CheckpointError(f"{f}: not a Zephon data loader state readable with weights_only=True "
                                  f"({type(e).__name__}: {e}); an Energon pickle state cannot be restored") from None
        if not isinstance(obj, dict) or "dataloader_state_dict" not in obj:
            raise CheckpointError(f"{f}: expected {{'dataloader_state_dict': ...}} as Megatron-LM saves it")
        states.append(obj["dataloader_state_dict"])
    return states


def datasets_provider(task_encoder, worker_config=None, *, args=None):
    """Train dataset and validation datasets, as in Megatron-LM's multimodal example."""
    args = _megatron_args(args)
    dname = args.data_path[0] if isinstance(args.data_path, list) else args.data_path
    extra = {}
    if getattr(args, "canonical_replicas", None):
        extra["canonical_replicas"] = args.canonical_replicas
    train_dataset = get_train_dataset(
        dname, batch_size=args.micro_batch_size, task_encoder=task_encoder, virtual_epoch_length=1000,
        max_samples_per_sequence=100, shuffle_buffer_size=100, worker_config=worker_config,
        packing_buffer_size=getattr(args, "packing_buffer_size", None), **extra)
    val_datasets = get_val_datasets(
        dname, batch_size=args.micro_batch_size, task_encoder=task_encoder, worker_config=worker_config,
        packing_buffer_size=getattr(args, "packing_buffer_size", None),
        limit=getattr(args, "eval_iters", None) and args.eval_iters * getattr(args, "num_microbatches", 1))
    # (validation gets no canonical_replicas: it restarts every evaluation, one lane per rank-worker as Energon)
    return train_dataset, [ds for ds, _src in val_datasets], None


def train_valid_test_dataloaders_provider(train_val_test_num_samples, task_encoder=None, *, args=None, dp_rank=None,
                                          dp_world_size=None, data_parallel_group=None):
    """Build train, validation and test data loaders (Megatron-LM's signature plus test hooks).

    Restores the train loader from ``args.dataloader_save`` at ``args.iteration`` when ``args.load`` is
    set (see the module docstring); raises rather than starting over when that fails."""
    args = _megatron_args(args)
    if task_encoder is None:
        from megatron.energon import DefaultTaskEncoder
        task_encoder = DefaultTaskEncoder()
    rank, world_size, group = _dp(dp_rank, dp_world_size, data_parallel_group)
    worker_config = WorkerConfig(rank=rank, world_size=world_size, num_workers=args.num_workers,
                                 data_parallel_group=group)
    train_ds, valid_ds, _test_ds = datasets_provider(task_encoder, worker_config, args=args)
    train_dataloader = get_savable_loader(train_ds)
    if getattr(args, "load", None) is not None and getattr(args, "dataloader_save", None) \
            and getattr(args, "iteration", 0):
        states = load_saved_states(args.dataloader_save, args.iteration, rank=rank, world_size=world_size,
                                   plan=train_ds.plan)
        train_dataloader.restore_state_rank(states)  # CheckpointError names what differs / which lanes lack
        print(f"restored dataset state of iteration {args.iteration} (the files of {len(states)} saved ranks) "
              f"at data-parallel rank {rank}/{world_size}")
    valid_dataloader = [EnergonDataloader(get_loader(ds)) for ds in valid_ds]
    return EnergonDataloader(train_dataloader), valid_dataloader, EnergonDataloader(None)


class EnergonDataloader:
    """A wrapper to use the loader with the Megatron-LM training loop (cycles over epochs)."""

    def __init__(self, dataloader):
        self._dataloader = dataloader
        self._iter = iter(cyclic_iter(dataloader)) if dataloader is not None else iter(())

    def __next__(self):
        return self._iter.__next__()

    def __iter__(self):
        return self._iter.__iter__()

    def save_state(self):
        return self._dataloader.save_state_rank()


def cyclic_iter(it):
    while True:
        n = 0
        for x in it:
            n += 1
            yield x
        if n == 0:  # an empty loader would spin forever
            raise RuntimeError("the data loader yielded nothing in a whole epoch (no samples for this rank?)")
