"""``StreamingDataLoader``: a ``torch.utils.data.DataLoader`` whose workers split the rank's lanes.

Each worker computes its own lanes (``zephon.host.worker_lanes``) and sends one item per ``num_workers`` steps,
the list of its lanes' micro-batches (``batch_size=None`` underneath): about one rank batch per item, as Mosaic's
workers send, so the main process takes one item per step. The main process puts the rank's steps back
together and records every lane's entry as the step is handed out (``zephon.host.RankSession.ordered_groups``), so
the state is exactly what the training loop received, whatever ``num_workers`` and ``prefetch_factor``. This module
translates Mosaic's loader surface (keywords, ``batch_size``, state calls) and collates rows; nothing else.
"""
from __future__ import annotations

from torch.utils.data import DataLoader, IterableDataset
from torch.utils.data._utils.collate import default_collate

from .dataset import StreamingDataset


def _identity(x):
    return x


class _LaneBatches(IterableDataset):
    """What the workers iterate: the dataset's per-step bundles of lane micro-batches."""

    def __init__(self, dataset: StreamingDataset):
        self.dataset = dataset

    def __iter__(self):
        return self.dataset._iter_lane_bundles()

    def __len__(self):  # an upper bound on items: at most one per step per worker holding lanes
        return self.dataset.steps_per_epoch * len(self.dataset.rank_lanes)

    # Composer looks for the state calls on ``dataloader.dataset``
    def state_dict(self, num_samples: int, from_beginning: bool) -> dict:
        """``StreamingDataset.state_dict``."""
        return self.dataset.state_dict(num_samples, from_beginning)

    def load_state_dict(self, obj) -> None:
        """``StreamingDataset.load_state_dict``."""
        self.dataset.load_state_dict(obj)


class StreamingDataLoader(DataLoader):
    """Drop-in for ``streaming.StreamingDataLoader`` over a ``zephon_streaming.StreamingDataset``.

    Takes ``DataLoader``'s arguments. ``batch_size`` must be None or the dataset's ``batch_size`` (one
    rank batch per global step); ``collate_fn`` (default torch's ``default_collate``) gets the list
    of that many sample dicts, in the main process. ``shuffle``, ``sampler`` and ``batch_sampler`` are
    refused (order is the dataset's). ``len()`` is the rank's batches per epoch. ``state_dict()`` /
    ``load_state_dict(obj)`` as Mosaic's: the state of exactly the batches yielded so far.
    Raises TypeError for another dataset type, ValueError for a refused or inconsistent argument."""

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
        super().__init__(_LaneBatches(dataset), batch_size=None, num_workers=num_workers, collate_fn=_identity,
                         **kwargs)

    @property
    def batch_size_per_rank(self) -> int:
        """Samples per rank batch (the dataset's ``batch_size``)."""
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
        self.num_samples_yielded = 0
        if claim["k0"] >= ds.steps_per_epoch:
            return
        session = ds._session(claim["epoch"], claim["start"])
        items = (item for bundle in super().__iter__() for item in bundle)  # a worker's lanes, num_workers steps
        for group in session.ordered_groups(items):  # one group per step: a lane's step is one micro-batch
            ds._channel.publish(claim["epoch"], group[0][0]["step"], session.lane_entries(), in_memory=True)
            rows = [r for _, mb in group for r in ds.rows(mb)]
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
        """``StreamingDataset.load_state_dict``: the next iteration starts there."""
        self.zephon_dataset.load_state_dict(obj)
