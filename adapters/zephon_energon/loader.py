"""``get_savable_loader`` / ``get_loader``: torch DataLoaders over an ``EnergonDataset``.

DataLoader workers each iterate their lanes (part of the rank's) and send ``(meta, batch)`` pairs, a list per
(step, micro-batch); the
dataset's ``zephon.host.RankSession`` puts them back in the rank's order (step, micro-batch, lane), agrees
with the other ranks where a finite pass ends, and records each lane's checkpoint entry as its batch is
handed to the training loop. ``save_state_rank()`` is therefore exactly what was consumed, independent of
``num_workers`` and prefetching, and plain JSON data (``torch.load(..., weights_only=True)`` reads it
back). States of several ranks merge into one that restores at any world size dividing
``canonical_replicas``. This module translates Energon's loader API (epochs, limits, state calls) only.
"""
from __future__ import annotations

import gc

import torch
import torch.distributed as dist
import torch.utils.data
from torch.utils.data._utils.collate import default_convert

from ._state import check_state, epoch_offset, merged_state
from .dataset import EnergonDataset, RefusedKeyword


def _convert(bundle):
    """What Energon's DataLoader (``batch_size=None``) does to each item, to each batch of a worker's bundle:
    ``default_convert`` (numpy arrays become tensors); the bookkeeping ``meta`` passes untouched."""
    return [(meta, default_convert(payload) if payload is not None else None) for meta, payload in bundle]


def _worker_init(_worker_id: int) -> None:
    """In a forked worker: disarm DataLoader iterators inherited from the parent (other live loaders);
    their ``__del__`` would otherwise signal the parent's workers to stop."""
    from torch.utils.data.dataloader import _MultiProcessingDataLoaderIter

    for obj in gc.get_objects():
        if type(obj) is _MultiProcessingDataLoaderIter:
            obj._shutdown = True


class _ZephonLoaderBase(torch.utils.data.DataLoader):
    def __init__(self, dataset, *, prefetch_factor: int = 2, cache_pool=None, **_accepted):
        if not isinstance(dataset, EnergonDataset):
            raise TypeError(f"{type(self).__name__} needs a dataset from zephon_energon.get_train_dataset / "
                            f"get_val_dataset, got {type(dataset).__name__}")
        if cache_pool is not None:
            raise RefusedKeyword("cache_pool: auxiliary file stores and cache pools are not supported by "
                                 "zephon_energon")
        self.worker_config = dataset.worker_config
        nw = self.worker_config.num_workers
        kwargs = {}
        if nw > 0:
            kwargs.update(prefetch_factor=prefetch_factor, multiprocessing_context="fork", persistent_workers=False,
                          worker_init_fn=_worker_init)
        super().__init__(dataset, batch_size=None, shuffle=False, num_workers=nw, collate_fn=_convert,
                         pin_memory=torch.cuda.is_available(), **kwargs)
        self._session = dataset.session
        self._source = None

    def __len__(self) -> int:
        return len(self.dataset)

    @property
    def dropped_rows(self) -> int:
        """Rows (samples, or packs with packing) of a finite pass (``repeat=False``, ``batch_drop_last=True``)
        after the last step every lane of every rank completed: not delivered, counted."""
        return self._session.dropped_rows

    def _ordered(self):
        """The rank's items in order from a fresh DataLoader iteration starting at the consumed state."""
        self._session.begin()
        if self.num_workers:
            gc.collect()  # as Energon: no dead DataLoader iterators in the forked workers (their __del__ runs there)
        bundles = torch.utils.data.DataLoader.__iter__(self)  # one per worker and (step, micro-batch)
        yield from self._session.ordered_items(item for bundle in bundles for item in bundle)

    def _take(self, limit=None, restart_finished: bool = False):
        """Yield up to ``limit`` batches from the live rank stream (started on demand); the session records
        each lane micro-batch's state as its last batch is handed out."""
        count, restarted = 0, False
        while limit is None or count < limit:
            if self._source is None:
                self._source = self._ordered()
            try:
                _meta, payload = next(self._source)
            except StopIteration:
                self._source = None
                if count == 0 and restart_finished and not restarted:  # a finished finite pass: start over
                    restarted = True
                    self._session.restart()  # a quota pass (fractional repetitions): the next one
                    continue
                return
            count += 1
            yield payload

    def _fresh(self) -> None:
        self._session.load(None)

    def close(self) -> None:
        """Stop this loader's worker processes (the next iteration starts them again)."""
        self._stop()

    def _stop(self) -> None:
        if self._source is not None:
            self._source.close()
            self._source = None

    def stats(self) -> dict:
        """Consumed state summary: ``step`` (global steps every lane of the rank completed), per-lane
        delivered rows and ``dropped_rows`` (a finite pass's tail, see the property)."""
        st = self._session.rank_state()
        return {"step": st["step"], "delivered_rows": {e["lane"]: e["delivered_rows"] for e in st["lanes"]},
                "dropped_rows": self.dropped_rows}


class SavableDataLoader(_ZephonLoaderBase):
    """Energon's ``SavableDataLoader`` contract on Zephon lanes.

    Iterating continues where the previous iteration stopped (Energon keeps its worker iterator alive);
    with ``virtual_epoch_length`` each ``iter()`` yields that many batches. After a finite pass
    (``repeat=False``) ended, the next ``iter()`` starts the pass again (with fractional ``repetitions``: the next
    quota pass, each dataset's shuffled stream continuing). ``save_state_rank()``: this
    rank's state (plain JSON data, what was consumed). ``restore_state_rank(state)``: a rank state, a
    merged state, or a list of rank states (merged here) -- restorable at another world size or worker
    count as long as every lane of this rank is in it; raises ``CheckpointError`` naming what differs or
    which lanes are missing. ``save_state_global(global_dst_rank)`` / ``restore_state_global(state,
    src_rank=None)``: Energon's collectives (a list of rank states on the destination rank)."""

    _epoch_offset = 0  # batches of the current (virtual / limited) epoch already handed out: Energon's offset
    _reset_pending = False  # a limited validation epoch ended: the next iter() starts the split again

    def _epoch_length(self):
        ds = self.dataset
        return (ds.virtual_epoch_length or None) if ds.training else ds.limit

    def __iter__(self):
        return self._epoch()

    def _epoch(self):
        """One ``iter()``: Energon's ``EpochizeDataset`` (``virtual_epoch_length``: that many batches, the stream
        continuing, an interrupted epoch resuming at its offset) or ``LimitDataset(reset_after_epoch=True)``
        (validation ``limit``: at most that many batches, then the split starts again)."""
        n, val = self._epoch_length(), not self.dataset.training
        if self._reset_pending:
            self._reset_pending = False
            self._stop()
            self._fresh()
        if n is not None and self._epoch_offset >= n:  # e.g. a state saved with a longer epoch
            self._epoch_offset = 0
        for payload in self._take(None if n is None else n - self._epoch_offset,
                                  restart_finished=self.dataset.plan.source.exhaustion in ("stop", "quota")):
            if n is not None:
                self._epoch_offset = (self._epoch_offset + 1) % n
                if val and self._epoch_offset == 0:
                    self._reset_pending = True
            yield payload
        if n is not None and self._epoch_offset:  # the stream (a finite pass) ended inside the epoch: it ends too
            self._epoch_offset = 0
            self._reset_pending = val
        if self._reset_pending:
            self._reset_pending = False
            self._stop()
            self._fresh()

    def save_state_rank(self) -> dict:
        state = self._session.rank_state()
        if self._epoch_length() is not None:
            state["epoch_offset"] = self._epoch_offset
        return state

    def restore_state_rank(self, state) -> None:
        check_state(state)
        offset = epoch_offset(state, self.dataset.plan.rank_lanes)
        self._stop()
        # None: the initial state (as Energon); a list of rank states is merged. Validated now: CheckpointError
        # names what differs or which lanes are missing.
        self._session.load(state)
        self._epoch_offset, self._reset_pending = offset, False

    def save_state_global(self, global_dst_rank: int):
        state = self.save_state_rank()
        wc = self.worker_config
        if wc.world_size > 1 and dist.is_available() and dist.is_initialized():
            out = [None] * wc.world_size if wc.global_rank() == global_dst_rank else None
            dist.gather_object(state, out, global_dst_rank, group=wc.data_parallel_group)
            return out
        return [state]

    def restore_state_global(self, state, *, src_rank=None) -> None:
        wc = self.worker_config
        if src_rank is not None and wc.world_size > 1 and dist.is_available() and dist.is_initialized():
            group = wc.data_parallel_group
            g_src = dist.get_global_rank(group, src_rank) if group is not None else src_rank
            box = [merged_state(state) if wc.rank == src_rank else None]
            dist.broadcast_object_list(box, src=g_src, group=group)
            state = box[0]
        self.restore_state_rank(state)

    # Energon's deprecated names
    def save_state(self, dst_rank: int):
        return self.save_state_global(dst_rank)

    def restore_state(self, state) -> None:
        self.restore_state_global(state)

    def can_restore_sample(self) -> bool:
        return False

    def config(self) -> dict:
        L = self.dataset.plan
        return {"type": type(self).__qualname__, "num_workers": self.num_workers, "fingerprint": L.fingerprint,
                "config": L.summary}


class BasicDataLoader(_ZephonLoaderBase):
    """Energon's ``BasicDataLoader`` (no state): every ``iter()`` starts at the beginning (with fractional
    ``repetitions``: of the next quota pass, as Energon continues); ``limit`` (``get_val_dataset``) caps the
    batches per iteration."""

    _iterated = False

    def __iter__(self):
        self._stop()
        if self._iterated:  # as Energon's: a quota pass (fractional repetitions) goes on to the next one
            self._session.restart()
        else:
            self._fresh()
        self._iterated = True
        return self._take(self.dataset.limit)


def get_savable_loader(dataset, *, worker_config=None, checkpoint_every_sec: float = 60,
                       checkpoint_every_min_n_samples=None, n_checkpoints=None, gc_collect_every_n_steps: int = 0,
                       prefetch_factor: int = 2, cache_pool=None, watchdog_timeout_seconds=60,
                       watchdog_initial_timeout_seconds=None, fail_on_timeout: bool = False) -> SavableDataLoader:
    """Energon's ``get_savable_loader``. ``checkpoint_every_sec``, ``checkpoint_every_min_n_samples`` and
    ``n_checkpoints`` tune Energon's internal worker snapshots; Zephon's state is exact per batch and
    needs none, so they have no effect. ``watchdog_*``/``fail_on_timeout``: accepted, no watchdog.
    ``gc_collect_every_n_steps``: ``gc.collect()`` in the workers every n lane micro-batches.
    ``cache_pool`` is refused."""
    _same_config(dataset, worker_config)
    dataset.gc_every = gc_collect_every_n_steps
    return SavableDataLoader(dataset, prefetch_factor=prefetch_factor, cache_pool=cache_pool)


def get_loader(dataset, *, worker_config=None, prefetch_factor: int = 2, cache_pool=None,
               watchdog_timeout_seconds=60, watchdog_initial_timeout_seconds=None,
               fail_on_timeout: bool = False) -> BasicDataLoader:
    """Energon's ``get_loader`` (no state; each iteration starts at the beginning)."""
    _same_config(dataset, worker_config)
    return BasicDataLoader(dataset, prefetch_factor=prefetch_factor, cache_pool=cache_pool)


def _same_config(dataset, worker_config) -> None:
    if worker_config is None or not isinstance(dataset, EnergonDataset):
        return
    a, b = worker_config, dataset.worker_config
    if (a.rank, a.world_size, a.num_workers) != (b.rank, b.world_size, b.num_workers):
        raise AssertionError("The worker_config passed to the loader does not match the one of the dataset "
                             "(as Energon checks)")
