"""Checkpoint aggregation across ranks. Here: ranks simulated in one process; torch.distributed
collectives and a shared directory plug in behind the same ``Aggregator`` interface."""
from .aggregate import Aggregator, LocalAggregator

__all__ = ["Aggregator", "LocalAggregator"]
