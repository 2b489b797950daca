"""Pointer streams: datasets, shuffles, mixtures, lanes and chunks. No I/O, no data, no runtime."""
from .lanes import TopologyError, check_share_rows, check_topology, lane_share, lanes_for_rank
from .mixture import Mixture, ScheduledMixture, integer_weights
from .permute import IndexPermutation, derive_key, mix64
from .schedule import Schedule
from .source import ChunkPointers, PartialPassWarning, WorkSource

__all__ = ["ChunkPointers", "IndexPermutation", "Mixture", "PartialPassWarning",
           "Schedule", "ScheduledMixture", "TopologyError",
           "WorkSource", "check_share_rows", "check_topology", "derive_key", "integer_weights", "lane_share",
           "lanes_for_rank", "mix64"]
