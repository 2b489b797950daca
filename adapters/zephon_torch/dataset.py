"""A Zephon pipeline as a ``torch.utils.data.IterableDataset``.

Each DataLoader worker builds its own ``zephon.Loader`` over a share of the rank's lanes
(``zephon.work.split_lanes``); the DataLoader's round robin over workers then reproduces the rank's
order, one item per lane micro-batch (``batch_size=None``). Items carry ``__state__`` (their lane's
checkpoint entry) so the consuming process can checkpoint exactly what it used, whatever the worker
count or prefetch depth (``zephon_torch.DataLoader`` / ``StatefulDataLoader`` do this).
"""
from __future__ import annotations

import sys

import numpy as np
import torch
from torch.utils.data import IterableDataset, get_worker_info

from zephon.engine import Loader
from zephon.work import split_lanes


def dp_from_environment(dp_degree=None, dp_rank=None) -> tuple[int, int]:
    """``(dp_degree, dp_rank)``: the given values, else the initialised default ``torch.distributed``
    process group's world size and rank, else ``(1, 0)``. Raises ``ValueError`` if only one is given."""
    if (dp_degree is None) != (dp_rank is None):
        raise ValueError("give both dp_degree and dp_rank, or neither (then torch.distributed decides)")
    if dp_degree is not None:
        return int(dp_degree), int(dp_rank)
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return torch.distributed.get_world_size(), torch.distributed.get_rank()
    return 1, 0


def to_torch(mb: dict) -> dict:
    """Convert a core micro-batch (numpy arrays, see ``zephon.ops.collate``) to torch: integer arrays
    become ``torch.long`` tensors ``[rows, ...]`` (``input_ids``, ``labels``, ``position_ids``,
    ``attention_mask``), float arrays keep their dtype, lists of arrays (``cu_seqlens``) become lists
    of tensors; other values are kept (``__src__`` provenance, ``__lane__``, ``__step__``, ...)."""
    out = {}
    for k, v in mb.items():
        if isinstance(v, np.ndarray):
            out[k] = torch.from_numpy(v.astype(np.int64) if v.dtype.kind in "iub" else v)
        elif isinstance(v, list) and v and all(isinstance(x, np.ndarray) for x in v):
            out[k] = [torch.from_numpy(x.astype(np.int64) if x.dtype.kind in "iub" else x) for x in v]
        else:
            out[k] = v
    return out


class ZephonIterableDataset(IterableDataset):
    """One data-parallel rank's Zephon pipeline, for ``torch.utils.data.DataLoader(batch_size=None)``.

    Args:
        datasets, ops: as for ``zephon.Loader`` (``open_dataset`` results; operators ending with
            ``Batch(micro_batch_size)``).
        dp_degree, dp_rank: this run's data-parallel size and rank; default: the initialised
            ``torch.distributed`` group, else 1 and 0.
        runner, num_workers: the core runner used when the DataLoader has no workers (default
            ``"threads"``, 2). ``worker_runner``, ``worker_num_workers``: the runner inside each
            DataLoader worker process (default ``"inline"``: the DataLoader workers are the parallelism).
        **loader_kwargs: the rest of ``zephon.Loader``'s arguments (``canonical_replicas``,
            ``global_batch_size``, ``seed``, ``weights``, ``chunk_size``, ``exhaustion``, ...).
    Yields one dict per lane micro-batch (``to_torch`` of ``Loader``'s micro-batch): tensors
    ``[micro_batch_size, max_length]`` plus ``__lane__``, ``__step__``, ``__micro__``, ``__state__``.
    A DataLoader worker owns ``split_lanes(rank_lanes, num_workers, worker_id)``; a worker that owns
    none ends at once. ``state_dict()``/``load_state_dict()`` follow torchdata's ``Stateful``
    protocol per process (the live lanes' checkpoint); prefer the loaders in this package, whose state
    is the rank's and survives a change of ``num_workers``. Raises what ``Loader`` raises
    (``TopologyError``, ``ValueError``, ``CheckpointError``, ``DataError`` while iterating)."""

    def __init__(self, datasets, ops, *, dp_degree=None, dp_rank=None, runner="threads", num_workers: int = 2,
                 worker_runner="inline", worker_num_workers: int = 1, **loader_kwargs):
        super().__init__()
        dp_degree, dp_rank = dp_from_environment(dp_degree, dp_rank)
        for k in ("lanes", "emit_state", "runner", "num_workers"):
            loader_kwargs.pop(k, None)
        self._args = (list(datasets), list(ops))
        self._kwargs = dict(loader_kwargs, dp_degree=dp_degree, dp_rank=dp_rank)
        self._main_runner = (runner, num_workers)
        self._worker_runner = (worker_runner, worker_num_workers)
        # The rank's template: config, fingerprint, lanes, starting state. Never iterated itself.
        self.loader = Loader(*self._args, emit_state=True, runner="inline", **self._kwargs)
        self._live: Loader | None = None
        self.report_drops = False  # set by this package's DataLoaders: numpy items and a drop-count marker

    def build_loader(self, lanes=None, runner=("inline", 1)) -> Loader:
        """A fresh ``Loader`` for ``lanes`` (default: the whole rank) starting from this dataset's
        starting state (``load_state_dict``)."""
        L = Loader(*self._args, emit_state=True, lanes=lanes, runner=runner[0], num_workers=runner[1],
                   **self._kwargs)
        L.restore(self.loader.checkpoint())
        return L

    def __iter__(self):
        info = get_worker_info()
        if info is None:
            L = self.build_loader(None, self._main_runner)
        else:
            L = self.build_loader(split_lanes(self.loader.rank_lanes, info.num_workers, info.id),
                                  self._worker_runner)
        self._live = L
        try:
            for mb in L:  # this package's DataLoaders convert after reassembly (cheaper across processes)
                yield mb if self.report_drops else to_torch(mb)
            if self.report_drops and L.dropped_rows:  # a finite stream's incomplete last step, for the count
                yield {"__dropped_rows__": L.dropped_rows}
        finally:
            if not sys.is_finalizing():  # a generator collected at exit: the pools are being torn down
                L.close()

    # -- torchdata Stateful protocol (per process) -----------------------------------------------
    def state_dict(self) -> dict:
        """The checkpoint of the lanes this process iterates (all of the rank's before iterating)."""
        return (self._live or self.loader).checkpoint()

    def load_state_dict(self, state: dict) -> None:
        """Start the next iteration from ``state`` (a rank's or merged global checkpoint; validated
        now: ``CheckpointError`` says what differs or which lanes are missing)."""
        self.loader.restore(state)
        self._live = None
