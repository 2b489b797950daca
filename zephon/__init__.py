"""Zephon: deterministic, elastic on-the-fly data loading for LLM pretraining.

Lanes, not ranks, own data: the global order is a pure function of the config, identical for every
dp_degree that divides ``canonical_replicas``, across checkpoints and resumes.
"""
from .checkpoint import CheckpointError, merge_states
from .engine import GlobalBatchHasher, Loader, LoaderPlan
from .formats import DataError, open_dataset
from .ops import Batch, Decode, EnsureMixture, Filter, Map, Pack, Shuffle, Tokenize
from .work import PartialPassWarning, Schedule, TopologyError, WorkSource

__version__ = "0.2.0"
__all__ = ["Batch", "CheckpointError", "DataError", "Decode", "EnsureMixture", "Filter", "GlobalBatchHasher", "Loader",
           "LoaderPlan", "Map", "Pack", "PartialPassWarning", "Schedule", "Shuffle", "Tokenize", "TopologyError",
           "WorkSource", "merge_states", "open_dataset"]
