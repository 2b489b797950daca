"""``gather_checkpoint``: this rank's state merged with every other rank's, over whichever transport the
job has (torch.distributed, a shared directory, or none for a single process). torch is imported only when
a torch.distributed job uses it."""
from __future__ import annotations

import os
import sys

from .merge import merge_states
from .shared_dir import DirectoryAggregator
from .torch_dist import TorchDistAggregator

# One aggregator per transport and settings, reused by gather_checkpoint: building a TorchDistAggregator is a
# collective (a new gloo group), and a DirectoryAggregator's round counter must advance from call to call.
_cache: dict = {}


def gather_checkpoint(state: dict, *, group=None, aggregate_dir=None, run_id: str | None = None,
                      world_size: int | None = None, rank: int | None = None, timeout: float = 300.0,
                      tag: str | None = None) -> dict:
    """Merge this rank's ``state`` (``Loader.checkpoint()``) with every other rank's; returns the global
    checkpoint on every rank. Call it on every rank, in the same order.

    Transport, first that applies:
      1. torch.distributed initialised: a ``TorchDistAggregator`` over ``group`` (None: the whole job),
         built on the first call and reused (so the first call is collective over the group's ranks).
         ``rank``, if given, must be this process's rank in the group.
      2. ``aggregate_dir`` given: a ``DirectoryAggregator(aggregate_dir, run_id, world_size, timeout)``;
         ``rank`` / ``world_size`` default to ``$RANK`` / ``$WORLD_SIZE``; ``run_id`` is required.
      3. otherwise a single process: ``merge_states([state])``, which names any lane it lacks (a
         multi-rank job without a transport gets that error instead of a partial checkpoint).
    ``timeout``: seconds to wait for the other ranks. ``tag``: the round's name in the shared directory (letters,
    digits, ``._-``; default the next ``round-N``), so ranks that count calls differently still meet. Raises
    ``AggregationError`` (missing ranks, timeout, run), ``CheckpointError`` (states that do not merge, named lanes),
    ``ValueError`` for missing or inconsistent arguments.
    """
    dist = sys.modules.get("torch.distributed")  # not imported means not initialised: never import torch here
    if dist is not None and dist.is_available() and dist.is_initialized():
        key = ("torch", dist.group.WORLD, group, float(timeout), run_id)
        agg = _cache.get(key)
        if agg is None:
            agg = _cache[key] = TorchDistAggregator(group, timeout, run_id=run_id)
        return agg.gather(agg.rank if rank is None else rank, state)
    if aggregate_dir is not None:
        if run_id is None:
            raise ValueError("gather_checkpoint(aggregate_dir=...) needs run_id (the same on every rank)")
        world_size = _from_env(world_size, "WORLD_SIZE", "world_size")
        rank = _from_env(rank, "RANK", "rank")
        key = ("dir", os.path.abspath(os.fspath(aggregate_dir)), run_id, world_size, float(timeout))
        agg = _cache.get(key)
        if agg is None:
            agg = _cache[key] = DirectoryAggregator(aggregate_dir, run_id, world_size, timeout)
        return agg.gather(rank, state, tag=tag)
    if world_size not in (None, 1):
        raise ValueError(f"world_size={world_size} but neither torch.distributed is initialised nor "
                         f"aggregate_dir given: no way to reach the other ranks")
    return merge_states([state])


def _from_env(value, env: str, what: str) -> int:
    if value is not None:
        return value
    raw = os.environ.get(env)
    if raw is None or not raw.strip().isdigit():
        raise ValueError(f"gather_checkpoint(aggregate_dir=...) needs {what} (argument or ${env})")
    return int(raw)

