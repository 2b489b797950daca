"""Iterating a ``StreamingDataset``: Mosaic's sample shape from the rank's steps, in any process torch runs it in.

In the main process (no DataLoader workers) the rank's lanes run here. Under ``torch.utils.data.DataLoader(ds,
batch_size=ds.batch_size, num_workers=W)`` torch collates ``batch_size`` consecutive samples of one worker and asks
the workers in turn, so worker ``(k - k0) % W`` yields the rank's whole step ``k``; ``zephon.host.exchange_steps``
gives it that step while each worker computes only its share of the lanes. ``StreamingDataLoader`` instead takes
each worker's lane micro-batches (``zephon.host.worker_steps``) and reassembles the rank's steps in the main
process. Either way the process that hands a step out publishes the rank's lane entries after it on the side
channel, for ``state_dict``.
"""
from __future__ import annotations

import os

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
        lane order; each step's lane entries are published before its first sample."""
        e, S = claim["epoch"], self.steps_per_epoch
        if claim["k0"] >= S:
            return
        session = self._session(e, claim["start"])
        steps = exchange_steps(session, os.path.join(self._channel.root, "x", key), W, w, S,
                               timeout=self.exchange_timeout, runner=self.runner, workers=self.num_threads)
        try:
            for k, group in steps:
                self._channel.publish(e, k, session.rank_state()["lanes"], in_memory=W == 0)
                for _, mb in group:
                    yield from self.rows(mb)
        finally:
            steps.close()

    def _iter_lane_bundles(self):
        """For ``StreamingDataLoader``'s workers: this worker's share of the lanes (``zephon.host.worker_lanes``),
        one item per step, the list of its lanes' ``(meta, micro-batch)`` of that step. One item per step and
        worker keeps torch's round robin in step order and costs one transfer per step, not one per lane."""
        claim = self._channel.current()
        info = get_worker_info()
        W, w = (info.num_workers, info.id) if info is not None else (0, 0)
        if claim["k0"] >= self.steps_per_epoch:
            return
        session = self._session(claim["epoch"], claim["start"])
        steps = worker_steps(session, W, w, self.steps_per_epoch, runner=self.runner, workers=self.num_threads)
        try:
            for _, items in steps:
                if items:  # a worker without lanes yields nothing (torch then skips it)
                    yield items
        finally:
            steps.close()

    def rows(self, mb: dict):
        """Split a lane micro-batch into sample dicts of decoded columns (Mosaic's sample shape)."""
        keys = [k for k in mb if not k.startswith("__") and not (self.text and k in ("cu_seqlens", "num_tokens"))]
        n = len(mb[keys[0]]) if keys else 0
        for i in range(n):
            yield {k: mb[k][i] for k in keys}
