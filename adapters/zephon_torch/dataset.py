"""A Zephon pipeline as a ``torch.utils.data.IterableDataset``.

Translation only: the rank's plumbing (worker shares of the lanes, reassembly, the consumed state) is
``zephon.host.RankSession``. Each DataLoader worker iterates its lanes (part of the rank's), one item per
lane micro-batch (``batch_size=None``; under this package's DataLoaders, one list of its lanes' micro-batches per
(step, micro-batch)); items carry their lane's checkpoint entry so the consuming process
can checkpoint exactly what it used, whatever the worker count or prefetch depth
(``zephon_torch.DataLoader`` / ``StatefulDataLoader`` do this).
"""
from __future__ import annotations

import sys

import numpy as np
import torch
from torch.utils.data import IterableDataset, get_worker_info

from zephon import Loader
from zephon.host import RankSession


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
            DataLoader worker process (default None: ``zephon.host.workers.HOST_WORKER_RUNNER``, one thread
            that reads ahead while the worker hands items out; ``"inline"`` computes only when asked).
        **loader_kwargs: the rest of ``zephon.Loader``'s arguments (``canonical_replicas``,
            ``global_batch_size``, ``seed``, ``weights``, ``chunk_size``, ``exhaustion``, ...).
    Yields one dict per lane micro-batch (``to_torch`` of ``Loader``'s micro-batch): tensors
    ``[micro_batch_size, max_length]`` plus ``__lane__``, ``__step__``, ``__micro__``, ``__state__``.
    A DataLoader worker owns ``zephon.host.worker_lanes(rank_lanes, num_workers, worker_id)``; a worker that owns
    none ends at once. ``state_dict()``/``load_state_dict()`` follow torchdata's ``Stateful``
    protocol per process (the live lanes' checkpoint); prefer the loaders in this package, whose state
    is the rank's and survives a change of ``num_workers``. Raises what ``Loader`` raises
    (``TopologyError``, ``ValueError``, ``CheckpointError``, ``DataError`` while iterating)."""

    def __init__(self, datasets, ops, *, dp_degree=None, dp_rank=None, runner="threads", num_workers: int = 2,
                 worker_runner=None, worker_num_workers=None, **loader_kwargs):
        super().__init__()
        dp_degree, dp_rank = dp_from_environment(dp_degree, dp_rank)
        for k in ("lanes", "emit_state", "runner", "num_workers"):
            loader_kwargs.pop(k, None)
        self._main_runner = (runner, num_workers)
        self._worker_runner = (worker_runner, worker_num_workers)
        self.session = RankSession.from_config(list(datasets), list(ops), dp_degree=dp_degree, dp_rank=dp_rank,
                                               **loader_kwargs)
        self._live: Loader | None = None
        self.report_drops = False  # set by this package's DataLoaders: (meta, numpy micro-batch) items

    @property
    def plan(self):
        """The rank's derived config (``zephon.engine.LoaderPlan``: lanes, fingerprint, step sizes, skipped steps)."""
        return self.session.plan

    def explain(self, steps, state=None, text_field=None) -> dict:
        """Every row of the global batches of ``steps`` (``zephon.host.RankSession.explain``)."""
        return self.session.explain(steps, state=state, text_field=text_field)

    def __iter__(self):
        info = get_worker_info()
        W, w = (0, 0) if info is None else (info.num_workers, info.id)
        runner = self._main_runner if info is None else self._worker_runner
        if self.report_drops:  # this package's DataLoaders reassemble and convert (cheaper across processes)
            yield from self.session.worker_bundles(W, w, runner=runner[0], workers=runner[1])
            return
        L = self.session.worker_loader(W, w, runner[0], runner[1])
        if L is None:
            return
        self._live = L
        try:
            for mb in L:
                yield to_torch(mb)
        finally:
            if not sys.is_finalizing():  # a generator collected at exit: the pools are being torn down
                L.close()

    # -- torchdata Stateful protocol (per process) -----------------------------------------------
    def state_dict(self) -> dict:
        """The checkpoint of the lanes this process iterates (all of the rank's before iterating)."""
        return self._live.checkpoint() if self._live is not None else self.session.start_state()

    def load_state_dict(self, state: dict) -> None:
        """Start the next iteration from ``state`` (a rank's or merged global checkpoint; validated
        now: ``CheckpointError`` says what differs or which lanes are missing). Inside a DataLoader worker
        (torchdata's per-worker protocol) ``state`` is that worker's own and needs only its lanes."""
        info = get_worker_info()
        self.session.load(state, worker=None if info is None else (info.num_workers, info.id))
        self._live = None
