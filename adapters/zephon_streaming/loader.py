"""``StreamingDataLoader``: a ``torch.utils.data.DataLoader`` whose workers split the rank's lanes.

Each worker runs ``Loader(lanes=split_lanes(rank_lanes, num_workers, worker_id), emit_state=True)``
and yields one item per step, the list of its lanes' micro-batches (``batch_size=None`` underneath);
torch's round robin over the workers keeps step order, the main process reassembles each rank batch and
records every lane's entry with ``engine.Progress``, so the state is exactly what the training loop
received, whatever ``num_workers`` and ``prefetch_factor``.
"""
from __future__ import annotations

from torch.utils.data import DataLoader, IterableDataset
from torch.utils.data._utils.collate import default_collate

from zephon.engine import Progress

from .dataset import StreamingDataset


def _identity(x):
    return x


class _LaneBatches(IterableDataset):
    """What the workers iterate: the dataset's lane micro-batches."""

    def __init__(self, dataset: StreamingDataset):
        self.dataset = dataset

    def __iter__(self):
        return self.dataset._iter_lane_batches()

    def __len__(self):  # an upper bound on items: one per step per worker holding lanes
        return self.dataset.steps_per_epoch * len(self.dataset.rank_lanes)

    # Composer looks for the state calls on ``dataloader.dataset``
    def state_dict(self, num_samples: int, from_beginning: bool) -> dict:
        return self.dataset.state_dict(num_samples, from_beginning)

    def load_state_dict(self, obj) -> None:
        self.dataset.load_state_dict(obj)


class StreamingDataLoader(DataLoader):
    """Drop-in for ``streaming.StreamingDataLoader`` over a ``zephon_streaming.StreamingDataset``.

    Takes ``DataLoader``'s arguments. ``batch_size`` must be None or the dataset's ``batch_size`` (one
    rank batch per global step); ``collate_fn`` (default torch's ``default_collate``) gets the list
    of that many sample dicts, in the main process. ``shuffle``, ``sampler`` and ``batch_sampler`` are
    refused (order is the dataset's). ``len()`` is the rank's batches per epoch. ``state_dict()`` /
    ``load_state_dict(obj)`` as Mosaic's: the state of exactly the batches yielded so far."""

    def __init__(self, dataset, batch_size=None, shuffle=None, sampler=None, batch_sampler=None, num_workers=0,
                 collate_fn=None, drop_last=False, **kwargs):
        if not isinstance(dataset, StreamingDataset):
            raise TypeError(f"zephon_streaming.StreamingDataLoader needs a zephon_streaming.StreamingDataset, got "
                            f"{type(dataset).__name__}; use torch.utils.data.DataLoader for other datasets")
        if batch_size is not None and batch_size != dataset.batch_size:
            raise ValueError(f"batch_size={batch_size} differs from the dataset's batch_size={dataset.batch_size}: a "
                             f"batch is one global step's rows of this rank; set them equal (or leave it None)")
        for name, v in (("shuffle", shuffle), ("sampler", sampler), ("batch_sampler", batch_sampler)):
            if v:
                raise ValueError(f"{name}={v!r}: the order is the dataset's (shuffle=/shuffle_seed= on "
                                 f"StreamingDataset); an iterable dataset takes no {name}")
        self.zephon_dataset = dataset
        self.user_collate = collate_fn or default_collate
        self.num_samples_yielded = 0
        self._progress = None
        super().__init__(_LaneBatches(dataset), batch_size=None, num_workers=num_workers, collate_fn=_identity,
                         **kwargs)

    @property
    def batch_size_per_rank(self) -> int:
        return self.zephon_dataset.batch_size

    @property
    def batch_size(self):
        """The rank's batch (samples per step), as on Mosaic's loader: Composer reads its per-device batch
        from ``train_dataloader.batch_size``. Underneath, items are not re-batched by torch."""
        ds = self.__dict__.get("zephon_dataset")
        return ds.batch_size if ds is not None else None

    @batch_size.setter
    def batch_size(self, value):  # DataLoader.__init__ assigns its own batch_size (None) once
        if value is not None:
            raise ValueError(f"StreamingDataLoader.batch_size is the dataset's batch_size; cannot set {value!r}")

    def __len__(self) -> int:
        return self.zephon_dataset.steps_per_epoch

    def __iter__(self):
        ds = self.zephon_dataset
        ds._iter_count += 1
        claim = ds._claim(f"sdl-{id(self)}-{ds._iter_count}")
        ds._channel.set_current(claim)  # workers (persistent or new) read it when their __iter__ starts
        e, k0, S = claim["epoch"], claim["k0"], ds.steps_per_epoch
        self.num_samples_yielded = 0
        if k0 >= S:
            return
        ref = ds._loader(e)
        if claim["start"] is not None:
            ref.restore(claim["start"])
        progress = Progress(ref)
        n_lanes, lanes = len(ref.lanes), list(ref.lanes)
        order = {lane: i for i, lane in enumerate(lanes)}
        buf = []
        for mb in (mb for bundle in super().__iter__() for mb in bundle):  # one bundle per worker per step
            progress.observe(mb)
            buf.append(mb)
            if len(buf) < n_lanes:
                continue
            buf.sort(key=lambda b: order.get(b["__lane__"], -1))  # workers hold interleaved lanes
            k = buf[0]["__step__"]
            if [b["__lane__"] for b in buf] != lanes or any(b["__step__"] != k for b in buf):
                raise RuntimeError(f"internal: lane micro-batches out of order at step {k}: "
                                   f"{[(b['__lane__'], b['__step__']) for b in buf]}")
            ds._channel.publish(e, k, [progress.entries[lane] for lane in sorted(progress.entries)], in_memory=True)
            rows = [r for b in buf for r in ds.rows(b)]
            buf = []
            self.num_samples_yielded += len(rows)
            yield self.user_collate(rows)

    def state_dict(self):
        """The dataset's state after the batches yielded by the current iteration (global sample count,
        counted from the start of the epoch)."""
        ds = self.zephon_dataset
        claim, _ = ds._channel.latest()
        k0 = claim["k0"] if claim else 0
        steps = self.num_samples_yielded // ds.batch_size
        return ds.state_dict((k0 + steps) * ds.global_batch_size, True)

    def load_state_dict(self, obj) -> None:
        self.zephon_dataset.load_state_dict(obj)
