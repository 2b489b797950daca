"""How per-rank checkpoints become one global checkpoint.

An ``Aggregator`` takes this rank's state (``Loader.checkpoint()``) and returns the merged global state
(``engine.merge_states``), restorable at any dp_degree dividing ``canonical_replicas``. Implementations
differ only in transport: ``LocalAggregator`` for ranks simulated in one process,
``TorchDistAggregator`` (torch_dist.py) over a torch.distributed group, ``DirectoryAggregator``
(shared_dir.py) over a shared filesystem. States travel as canonical JSON, never pickle: loading a
checkpoint must not run code.
"""
from __future__ import annotations

from .merge import merge_states
from .schema import CheckpointError


class AggregationError(CheckpointError):
    """Per-rank states could not be collected: a rank is missing (dead, hung, never called ``gather``)
    or the transport failed. Raised instead of the transport's own error, with a message naming the
    missing ranks (when known), the timeout and the run.

    Attributes: ``missing_ranks`` (sorted list of ranks, empty when unknown), ``timeout`` (seconds or
    None), ``run`` (run id / group description or None)."""

    def __init__(self, message: str, missing_ranks=(), timeout: float | None = None, run: str | None = None):
        super().__init__(message)
        self.missing_ranks = sorted(missing_ranks)
        self.timeout = timeout
        self.run = run

    def __reduce__(self):  # picklable across processes with its attributes
        return (type(self), (str(self), self.missing_ranks, self.timeout, self.run))


class Aggregator:
    """Interface. ``gather(rank, state) -> dict | None``: contribute one rank's state; returns the
    global state once every rank has contributed (``LocalAggregator`` returns None before that; the
    collective aggregators block and return it on every rank). ``world_size``: ranks expected."""

    world_size: int

    def gather(self, rank: int, state: dict):
        raise NotImplementedError


class LocalAggregator(Aggregator):
    """Ranks simulated in one process: collects ``world_size`` states, then merges them.

    Raises ``CheckpointError`` for a rank outside ``[0, world_size)``, a rank contributing twice, or
    (from ``merge_states``) conflicting or missing lanes."""

    def __init__(self, world_size: int):
        self.world_size = world_size
        self._states: dict[int, dict] = {}

    def gather(self, rank: int, state: dict):
        if not 0 <= rank < self.world_size:
            raise CheckpointError(f"rank {rank} outside [0, {self.world_size})")
        if rank in self._states:
            raise CheckpointError(f"rank {rank} contributed its state twice")
        self._states[rank] = state
        if len(self._states) < self.world_size:
            return None
        merged = merge_states(self._states[r] for r in range(self.world_size))
        self._states = {}
        return merged
