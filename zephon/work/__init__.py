"""Pointer streams: datasets, shuffles, mixtures, lanes and chunks. No I/O, no data, no runtime."""
from .lanes import TopologyError, check_topology, lanes_for_rank
from .mixture import Mixture, integer_weights
from .permute import IndexPermutation, derive_key, mix64
from .source import ChunkPointers, WorkSource

__all__ = ["ChunkPointers", "IndexPermutation", "Mixture", "TopologyError", "WorkSource", "check_topology",
           "derive_key", "integer_weights", "lanes_for_rank", "mix64"]
