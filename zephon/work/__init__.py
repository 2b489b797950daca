"""Pointer streams: datasets, shuffles, mixtures, lanes and chunks. No I/O, no data, no runtime."""
from .batching import BATCHING_METHODS, epoch_steps, stratified_counts
from .lanes import TopologyError, check_replicas, check_share_rows, check_topology, lane_share, lanes_for_rank
from .mixture import Mixture, ScheduledMixture, integer_weights
from .permute import IndexPermutation, derive_key, mix64
from .schedule import Schedule
from .source import ChunkPointers, PartialPassWarning, WorkSource

__all__ = ["BATCHING_METHODS", "ChunkPointers", "IndexPermutation", "Mixture", "PartialPassWarning",
           "Schedule", "ScheduledMixture", "TopologyError", "WorkSource", "check_replicas",
           "check_share_rows", "check_topology", "derive_key", "integer_weights", "lane_share",
           "epoch_steps", "lanes_for_rank", "mix64", "stratified_counts"]
