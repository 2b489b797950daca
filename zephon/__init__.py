"""Zephon: deterministic, elastic on-the-fly data loading for LLM pretraining.

Lanes, not ranks, own data: the global order is a pure function of the config, identical for every
dp_degree that divides ``canonical_replicas``, across checkpoints and resumes.
"""
from .engine.exports import lazy_exports

# imported on first use (zephon.engine.exports): ``from zephon import Loader`` works as before
__getattr__, __dir__ = lazy_exports(__name__, {
    "CheckpointError": ".checkpoint", "merge_states": ".checkpoint", "GlobalBatchHasher": ".engine",
    "Loader": ".engine", "LoaderPlan": ".engine", "DataError": ".formats", "open_dataset": ".formats",
    **{name: ".ops" for name in ("Batch", "Decode", "EnsureMixture", "Filter", "Map", "Pack", "Shuffle", "Tokenize")},
    **{name: ".work" for name in ("PartialPassWarning", "Schedule", "TopologyError", "WorkSource")}})

__version__ = "0.2.0"
__all__ = ["Batch", "CheckpointError", "DataError", "Decode", "EnsureMixture", "Filter", "GlobalBatchHasher", "Loader",
           "LoaderPlan", "Map", "Pack", "PartialPassWarning", "Schedule", "Shuffle", "Tokenize", "TopologyError",
           "WorkSource", "merge_states", "open_dataset"]
