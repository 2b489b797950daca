"""torch DataLoaders whose state is the rank's Zephon checkpoint.

They iterate a ``ZephonIterableDataset`` with ``batch_size=None`` (one item per lane micro-batch from
the workers), reassemble the rank's lane micro-batches of each (step, micro-batch) into one local
micro-batch, and record each lane's checkpoint entry as it is handed to the training loop
(``zephon.engine.Progress``). The state therefore reflects exactly what the loop consumed, and it does
not depend on ``num_workers`` or prefetching: save with 2 workers, resume with 0 or 3.
"""
from __future__ import annotations

import itertools

import numpy as np
import torch
import torch.utils.data
from torchdata.stateful_dataloader import StatefulDataLoader as _TorchdataStatefulDataLoader

from zephon.engine import Progress, StepAssembly

from .dataset import ZephonIterableDataset, to_torch

#: Bookkeeping keys of a lane micro-batch, replaced by per-row ``__lane__`` and one ``__step__``.
_META = ("__lane__", "__step__", "__micro__", "__state__")
#: Per-row values of varying length: always a list with one tensor per row.
_RAGGED = ("cu_seqlens",)


def _concat(parts: list[dict]) -> dict:
    """Concatenate lane micro-batches (numpy, as the workers send them; same step and micro-batch index)
    along rows in lane order, then convert to torch (``to_torch``)."""
    out = {}
    for k in parts[0]:
        if k in _META:
            continue
        vals = [p[k] for p in parts]
        if k in _RAGGED or (isinstance(vals[0], np.ndarray) and len({v.shape[1:] for v in vals}) > 1):
            out[k] = [row for v in vals for row in v]  # one array per row (document boundaries vary)
        elif isinstance(vals[0], np.ndarray):
            out[k] = np.concatenate(vals) if len(vals) > 1 else vals[0]
        else:
            out[k] = [x for v in vals for x in v] if isinstance(vals[0], list) else vals
    out = to_torch(out)
    out["__lane__"] = torch.tensor([p["__lane__"] for p in parts for _ in range(_rows(p))], dtype=torch.long)
    out["__step__"] = parts[0]["__step__"]
    out["__micro__"] = parts[0]["__micro__"]
    return out


def _rows(mb: dict) -> int:
    for v in mb.values():
        if isinstance(v, (np.ndarray, torch.Tensor)) and v.ndim >= 1:
            return int(v.shape[0])
    raise ValueError("micro-batch without a per-row array")


def _as_is(item):
    """collate_fn for ``batch_size=None``: keep the worker's numpy micro-batch. torch's default would make
    tensors, which cross processes one shared-memory handle per tensor (a connection handshake each)
    instead of one pickled buffer; conversion happens once per local micro-batch in the main process."""
    return item


class _RankStateMixin:
    """State handling shared by both DataLoader flavours (see the module docstring)."""

    def _zephon_init(self, dataset, kwargs):
        if not isinstance(dataset, ZephonIterableDataset):
            raise TypeError(f"{type(self).__name__} needs a zephon_torch.ZephonIterableDataset, "
                            f"got {type(dataset).__name__}")
        if kwargs.get("batch_size", None) is not None:
            raise ValueError("batch_size must be None: the Zephon pipeline batches (its final Batch(micro_batch_size) "
                             "operator and global_batch_size); one item is one local micro-batch")
        if kwargs.get("persistent_workers"):
            raise ValueError("persistent_workers=True would carry rows prefetched but never consumed into the next "
                             "iteration; Zephon restarts workers from the consumed state instead")
        kwargs["batch_size"] = None
        if kwargs.get("collate_fn") is None:  # absent or torch's default spelled out: numpy transport
            kwargs["collate_fn"] = _as_is
        dataset.report_drops = True  # ... and yields numpy micro-batches (see _as_is)
        self._progress = Progress(dataset.loader)
        self._agree_group = None
        self.dropped_rows = 0  # a finite stream's rows after the last step every lane and rank completed

    def _assembled(self, items):
        loader = self.dataset.loader
        rps = loader.rows_per_step
        asm = StepAssembly(loader.rank_lanes, self._progress.checkpoint()["lanes"], rps,
                           loader.batch.micro_batch_size)

        def groups():
            for mb in items:
                if "__dropped_rows__" in mb:  # a worker's lanes ended inside a step (drop_last)
                    self.dropped_rows += mb["__dropped_rows__"]
                    continue
                yield from asm.add(mb["__step__"], mb["__micro__"], mb["__lane__"], mb)
            yield from asm.finish()

        if loader.source.exhaustion == "stop" and loader.batch.drop_last:
            start = {e["lane"]: e["delivered_rows"] for e in self._progress.checkpoint()["lanes"]}
            yield from self._agreed_steps(groups(), start, rps)
        else:
            for group in groups():
                yield self._emit(group)

    def _agreed_steps(self, groups, delivered, rps):
        """A finite stream with drop_last: workers' lanes, and ranks, run out at different steps (a rank
        that stopped early would hang the others in their next collective). Each step is buffered and
        released only when all the rank's lanes, and under torch.distributed every rank (one all_reduce
        MIN per step on a gloo group), hold it complete; the first step that is not ends the stream
        everywhere, its rows counted in ``dropped_rows``."""
        import torch.distributed as dist

        distributed = _world_size() > 1
        if distributed and self._agree_group is None:
            self._agree_group = dist.new_group(backend="gloo")
        it = itertools.chain(groups, [None])
        group = next(it)
        while True:  # one round per step; the round after the last step tells the other ranks to stop
            step, buffered = (None if group is None else group[0]["__step__"]), []
            while group is not None and group[0]["__step__"] == step:
                buffered.append(group)
                group = next(it)
            for g in buffered:
                for mb in g:
                    delivered[mb["__lane__"]] += _rows(mb)
            complete = step is not None and all(delivered[lane] >= (step + 1) * rps for lane in delivered)
            if distributed:
                flag = torch.tensor([1 if complete else 0], dtype=torch.int32)
                dist.all_reduce(flag, op=dist.ReduceOp.MIN, group=self._agree_group)
                complete = bool(flag.item())
            if not complete:  # count what is left of the pass (at most about a chunk per lane)
                rest = itertools.chain(buffered, [group], it)  # `it` ends with the None sentinel
                self.dropped_rows += sum(_rows(mb) for g in rest if g is not None for mb in g)
                return
            for g in buffered:
                yield self._emit(g)

    def _emit(self, group):
        for mb in group:
            self._progress.observe(mb)
        return _concat(group)

    def _before_iter(self):
        # A new iteration (or the first after load_state_dict) starts from what was consumed.
        self.dataset.load_state_dict(self._progress.checkpoint())

    def rank_state_dict(self) -> dict:
        """This rank's checkpoint (its lanes) as of the last local micro-batch handed out: JSON data."""
        return self._progress.checkpoint()

    def global_state_dict(self, **gather_kwargs) -> dict:
        """Every rank's state merged (a collective when torch.distributed is initialised: call it on
        all ranks; see ``zephon.dist.gather_checkpoint`` for ``aggregate_dir``/``run_id``/``timeout``).
        Restorable at any dp degree that divides ``canonical_replicas``."""
        from zephon.dist import gather_checkpoint

        return gather_checkpoint(self.rank_state_dict(), **gather_kwargs)

    def _load_zephon_state(self, state: dict) -> None:
        self.dataset.load_state_dict(state)  # validates: CheckpointError names what differs / lacks
        self._progress.reset()


class DataLoader(_RankStateMixin, torch.utils.data.DataLoader):
    """``torch.utils.data.DataLoader`` over a ``ZephonIterableDataset`` with a rank checkpoint.

    Same keyword arguments as torch's DataLoader (``num_workers``, ``pin_memory``, ``prefetch_factor``,
    ``multiprocessing_context``, ...); ``batch_size`` must be None and ``persistent_workers`` False.
    Yields local micro-batches: the rank's lane micro-batches of one (step, micro) concatenated in lane
    order, tensors ``[lanes * micro_batch_size, max_length]`` plus ``__lane__`` (per row), ``__step__``,
    ``__micro__``. ``state_dict()`` (this rank's lanes, or merged over ranks when torch.distributed is
    initialised: then a collective) and ``load_state_dict(state)`` (a rank's or a merged state; the next
    ``iter()`` starts there). Raises ``CheckpointError`` for a state of another config or missing lanes."""

    def __init__(self, dataset, **kwargs):
        self._zephon_init(dataset, kwargs)
        super().__init__(dataset, **kwargs)

    def __iter__(self):
        self._before_iter()
        return self._assembled(super().__iter__())

    def state_dict(self) -> dict:
        return _default_state(self)

    def load_state_dict(self, state: dict) -> None:
        self._load_zephon_state(state)


class StatefulDataLoader(_RankStateMixin, _TorchdataStatefulDataLoader):
    """``torchdata.stateful_dataloader.StatefulDataLoader`` whose state is Zephon's rank checkpoint.

    An instance of torchdata's class (same keyword arguments; ``batch_size`` None, ``persistent_workers``
    False), but ``state_dict()`` returns plain JSON data that does not depend on ``num_workers`` (torchdata's
    own per-worker snapshots require the same worker count), so ``load_state_dict`` accepts a state saved
    with any number of workers, and a merged state saved at another dp degree. Yields what
    ``zephon_torch.DataLoader`` yields."""

    def __init__(self, dataset, **kwargs):
        self._zephon_init(dataset, kwargs)
        # torchdata's worker snapshots are not used (the state comes from consumed items): take them rarely.
        kwargs.setdefault("snapshot_every_n_steps", 1 << 30)
        super().__init__(dataset, **kwargs)

    def __iter__(self):
        self._before_iter()
        self.next_iter_state = None  # torchdata's per-worker replay is not used: workers start from our state
        self._iterator = None
        return self._assembled(super().__iter__())

    def state_dict(self) -> dict:
        return _default_state(self)

    def load_state_dict(self, state: dict) -> None:
        self._load_zephon_state(state)
        self._iterator = None


def _world_size() -> int:
    dist = torch.distributed
    return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1


def _default_state(dl) -> dict:
    """Merged over ranks when a process group is up (every rank holds the global state), else the rank's."""
    if _world_size() > 1:
        return dl.global_state_dict()
    return dl.rank_state_dict()
