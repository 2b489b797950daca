"""``EnergonDataset``: what ``get_train_dataset`` / ``get_val_dataset`` return.

It is a torch ``IterableDataset`` holding one data-parallel rank's Zephon pipeline:

    WorkSource (mixture of the prepared datasets, seeded permutations, ``canonical_replicas`` lanes)
      -> workers: read tar members (``.tar.idx`` random access), build Energon samples from
         ``field_map`` (or crude samples + cookers), ``encode_sample``            [EncodeSamples]
      -> pump, one accumulator per lane: shuffle buffer (``shuffle_buffer_size``), the task
         encoder's packing (``packing_buffer_size``)                              [Shuffle, TaskPack]
      -> tail: ``batch_size`` rows of one lane per micro-batch (``batch_drop_last``) [Batch]
      -> ``task_encoder.batch`` + ``encode_batch`` on that lane micro-batch.

Iterated by a DataLoader worker it runs that worker's lanes and yields lists of ``(meta, batch)``
pairs whose ``meta`` carries the lane's checkpoint entry (``zephon.host.RankSession.worker_bundles``); the
loaders of this package (``get_savable_loader``) put the lanes back in the rank's order, agree where a
finite pass ends and keep the consumed state through the same session.
"""
from __future__ import annotations

import gc

from torch.utils.data import IterableDataset, get_worker_info

from zephon.host import RankSession
from zephon.ops import GROUP_ROWS

from ._hooks import call_hook, energon_context, expand_result, overridden
from .keywords import error_handler


class EnergonDataset(IterableDataset):
    """One rank's pipeline (see the module docstring). Built by ``get_train_dataset`` /
    ``get_val_dataset``; attributes: ``worker_config``, ``session`` (the rank's ``zephon.host.RankSession``,
    shared with the loader), ``plan`` (the rank's ``zephon.LoaderPlan``: config, fingerprint, lanes),
    ``batch_size``, ``virtual_epoch_length``, ``limit``, ``training``."""

    def __init__(self, *, datasets, weights, ops, loader_kwargs, worker_config, task_encoder, batch_size,
                 training: bool, virtual_epoch_length: int = 0, limit=None, seed_offset: int = 0,
                 gc_every: int = 0, sources=(), grouped: bool = False):
        super().__init__()
        self.worker_config = worker_config
        self.task_encoder = task_encoder
        self.batch_size = batch_size
        self.training = training
        self.virtual_epoch_length = virtual_epoch_length
        self.limit = limit
        self.seed_offset = seed_offset
        self.gc_every = gc_every
        self.sources = list(sources)
        self.grouped = grouped  # batch_group_criterion: each lane micro-batch is one group batch (GROUP_ROWS)
        # Energon's data-parallel group is the set of ranks that must agree where a finite pass ends.
        self.session = RankSession.from_config(
            list(datasets), list(ops), weights=weights, **loader_kwargs,
            agreement_group=getattr(worker_config, "data_parallel_group", None),
            warn_context={"host": "zephon_energon", "drop_last": "batch_drop_last={}", "finite": "repeat=False",
                          "dropped": "loader.dropped_rows"})
        self._batch_hooks = overridden(task_encoder, "batch"), overridden(task_encoder, "encode_batch")
        self._since_gc = 0

    @property
    def plan(self):
        """The rank's derived config (``zephon.engine.LoaderPlan``: lanes, fingerprint, step sizes, skipped steps)."""
        return self.session.plan

    def explain(self, steps, state=None, text_field=None) -> dict:
        """Every row of the global batches of ``steps`` (``zephon.host.RankSession.explain``)."""
        return self.session.explain(steps, state=state, text_field=text_field)

    def __len__(self) -> int:
        if self.virtual_epoch_length:
            return self.virtual_epoch_length
        if self.limit:
            return self.limit
        raise TypeError("the length of a Zephon Energon dataset is known only with virtual_epoch_length (train) or "
                        "limit (val): packing, SkipSample and generator hooks change it")

    def __iter__(self):
        """This process's lanes (a DataLoader worker's, or all of them without workers): lists of ``(meta, payload)``
        items of ``RankSession.worker_items``, one list per (step, micro-batch) (``RankSession.worker_bundles``: one
        DataLoader item carries every lane of the worker), payloads from ``_finish``."""
        info = get_worker_info()
        W, w = (0, 0) if info is None else (info.num_workers, info.id)
        self._since_gc = 0
        # In a DataLoader worker, the hosts' read-ahead runner (zephon.host.workers.HOST_WORKER_RUNNER): a lane that
        # starts a chunk fills its shuffle buffer ahead of the batch that waits on it. In the main process, inline:
        # Energon's worker context is process-wide, so hooks run one at a time under a lock, and a garbage collection
        # inside a hook that closes another loader of the process waits for that loader's threads, which wait for the
        # lock (a deadlock, seen in tests/test_energon_adapter.py). A forked worker holds no other loader's threads.
        yield from self.session.worker_bundles(W, w, finish=self._finish, runner="inline" if W == 0 else None)

    def _finish(self, mb) -> list:
        """A lane micro-batch -> what the loader yields: the sample (``batch_size=None``) or
        ``encode_batch(batch(samples))`` (a generator may give several batches, ``SkipSample`` none).
        Also Energon's ``gc_collect_every_n_steps`` (counted in lane micro-batches of this process)."""
        self._since_gc += 1
        if self.gc_every and self._since_gc % self.gc_every == 0:
            gc.collect()
        if self.grouped:
            samples = [r["sample"] for r in mb[GROUP_ROWS][0]]
        else:
            samples = list(mb["sample"])
            if self.batch_size is None:
                return samples
        src = mb["__src__"][0]
        first = src[0][0] if isinstance(src, list) else src[3]
        record = {"__src__": src if not isinstance(src, list) else None}
        handler = error_handler(self.worker_config)
        te = self.task_encoder
        with energon_context(self.seed_offset, first):
            batch = call_hook(te.batch, samples, record, handler, "batch")
            if batch is None:
                return []
            if not self._batch_hooks[1]:
                return [batch]
            return expand_result(call_hook(te.encode_batch, batch, record, handler, "encode_batch"), record,
                                 handler, "encode_batch")
