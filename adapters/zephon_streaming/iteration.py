"""Iterating a ``StreamingDataset``: Mosaic's sample shape from the rank's steps, in any process torch runs it in.

In the main process (no DataLoader workers) the rank's lanes run here. Under ``torch.utils.data.DataLoader(ds,
batch_size=ds.batch_size, num_workers=W)`` torch collates ``batch_size`` consecutive samples of one worker and asks
the workers in turn, so worker ``(k - k0) % W`` yields the rank's whole step ``k``; ``zephon.host.exchange_steps``
gives it that step while each worker computes only its own lanes. ``StreamingDataLoader`` instead takes
each worker's lane micro-batches (``zephon.host.worker_steps``) and reassembles the rank's steps in the main
process. Either way the process that hands a step out publishes the rank's lane entries after it on the side
channel, for ``state_dict``.
"""
from __future__ import annotations

import os
import sys

from torch.utils.data import get_worker_info

from zephon.host import exchange_steps, worker_steps


class RankIteration:
    """``StreamingDataset``'s iteration (a mixin: it uses the dataset's config, ``_channel`` and ``_session``)."""

    def __iter__(self):
        """The next epoch (or the loaded state's): this rank's samples, step after step, each a dict of columns."""
        info = get_worker_info()
        self._iter_count += 1
        if info is None:
            key, W, w = f"main-{os.getpid()}-{id(self)}-{self._iter_count}", 0, 0
        else:  # workers of one DataLoader iteration share seed - id; persistent workers count their calls
            key, W, w = f"w-{info.seed - info.id}-{self._iter_count}", info.num_workers, info.id
        return self._iter_rank(self._claim(key), key, W, w)

    def _iter_rank(self, claim: dict, key: str, W: int, w: int):
        """Samples of the steps DataLoader worker ``w`` of ``W`` hands out (0 workers: every step), whole steps in
        lane order; each step's lane entries are published before its first sample. Raises ValueError (at the
        first sample) when the DataLoader that drives a worker batches otherwise (``check_host_batch``)."""
        if W >= 2:
            check_host_batch(self.batch_size, W, host_batch_size(sys._getframe(1)))
        e, S = claim["epoch"], self.steps_per_epoch
        if claim["k0"] >= S:
            return
        session = self._session(e, claim["start"])
        steps = exchange_steps(session, os.path.join(self._channel.root, "x", key), W, w, S,
                               timeout=self.exchange_timeout, runner=self.runner, workers=self.num_threads)
        try:
            for k, group in steps:
                self._channel.publish(e, k, session.lane_entries(), in_memory=W == 0)
                for _, mb in group:
                    yield from self.rows(mb)
        finally:
            steps.close()

    def _iter_lane_bundles(self):
        """For ``StreamingDataLoader``'s workers: this worker's lanes (``zephon.host.worker_lanes``), one item per
        ``num_workers`` steps, the list of its lanes' ``(meta, micro-batch)`` of those steps
        (``RankSession.worker_bundles``). An item holds about one rank batch, as a Mosaic worker's does, so the
        training process takes one item per step and ``prefetch_factor`` counts rank batches."""
        claim = self._channel.current()
        info = get_worker_info()
        W, w = (info.num_workers, info.id) if info is not None else (0, 0)
        if claim["k0"] >= self.steps_per_epoch:
            return
        session = self._session(claim["epoch"], claim["start"])
        steps = worker_steps(session, W, w, self.steps_per_epoch, runner=self.runner, workers=self.num_threads)
        try:
            yield from session.worker_bundles(W, w, max(W, 1), items=(item for _, items in steps for item in items))
        finally:
            steps.close()

    def rows(self, mb: dict):
        """Split a lane micro-batch into sample dicts of decoded columns (Mosaic's sample shape), or into what a
        subclass's ``__getitem__`` makes of each sample's id (``zephon.host.SampleItems``)."""
        keys = [k for k in mb if not k.startswith("__") and not (self.text and k in ("cu_seqlens", "num_tokens"))]
        n = len(mb[keys[0]]) if keys else 0
        rows = ({k: mb[k][i] for k in keys} for i in range(n))
        if self._item_hook:
            yield from self._items.items(rows, mb["__src__"], self.__getitem__)
        else:
            yield from rows


_NOT_FOUND = object()


def host_batch_size(frame, depth: int = 6):
    """The batch size of the torch DataLoader whose worker is fetching from this generator, read off torch's
    ``_IterableDatasetFetcher.fetch(possibly_batched_index)`` among the ``depth`` frames above ``frame``: an int
    (``len(possibly_batched_index)``), None for ``batch_size=None`` (one sample per fetch), or ``_NOT_FOUND``
    when no such frame is there (another host, or a torch whose fetcher looks otherwise: nothing is checked)."""
    try:
        from torch.utils.data._utils.fetch import _IterableDatasetFetcher
    except ImportError:  # pragma: no cover - a torch without the private fetcher
        return _NOT_FOUND
    while frame is not None and depth > 0:
        if frame.f_code.co_name == "fetch" and isinstance(frame.f_locals.get("self"), _IterableDatasetFetcher):
            fetcher, index = frame.f_locals["self"], frame.f_locals.get("possibly_batched_index")
            if not getattr(fetcher, "auto_collation", True):
                return None
            try:
                return len(index)
            except TypeError:
                return _NOT_FOUND
        frame, depth = frame.f_back, depth - 1
    return _NOT_FOUND


def check_host_batch(batch_size: int, num_workers: int, host_batch) -> None:
    """Refuse a torch DataLoader with ``num_workers`` >= 2 whose batch is not the dataset's ``batch_size``.

    Each worker yields whole steps of ``batch_size`` samples (the rank's batch) and the DataLoader takes each batch
    from one worker in turn, so another batch size mixes steps of different workers into one batch and the
    checkpoint (counted in steps) would replay some samples and skip others, silently.
    batch_size: the dataset's per-rank batch (samples). num_workers: the DataLoader's workers. host_batch: what
    ``host_batch_size`` found (samples per fetch; None for ``batch_size=None``; ``_NOT_FOUND``: no check).
    Raises ValueError naming both numbers and what to do."""
    if host_batch is _NOT_FOUND or host_batch == batch_size:
        return
    given = "batch_size=None (one sample per fetch)" if host_batch is None else f"batch_size={host_batch}"
    raise ValueError(
        f"torch DataLoader {given} differs from the StreamingDataset's batch_size={batch_size}: with "
        f"num_workers={num_workers} the DataLoader takes each batch from one worker in turn and each worker yields "
        f"whole steps of {batch_size} samples, so its batches would mix steps and a checkpoint would repeat some "
        f"samples and skip others; use DataLoader(dataset, batch_size=dataset.batch_size) (={batch_size}), or "
        f"zephon_streaming.StreamingDataLoader, or num_workers <= 1")
