"""Zephon: deterministic, elastic on-the-fly data loading for LLM pretraining.

Lanes, not ranks, own data: the global order is a pure function of the config, identical for every
dp_degree that divides ``canonical_replicas``, across checkpoints and resumes.
"""
from .engine.exports import lazy_exports

# imported on first use (zephon.engine.exports): ``from zephon import Loader`` works as before
_EXPORTS = {
    "CheckpointError": ".checkpoint", "merge_states": ".checkpoint", "GlobalBatchHasher": ".engine",
    "Loader": ".engine", "LoaderPlan": ".engine", "DataError": ".formats", "open_dataset": ".formats",
    **{name: ".ops" for name in ("Batch", "Decode", "EnsureMixture", "Filter", "Map", "Pack", "Shuffle", "Tokenize")},
    **{name: ".work" for name in ("PartialPassWarning", "Schedule", "TopologyError", "WorkSource")}}
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
__all__ = sorted(_EXPORTS)  # the public names are the exports, one list

__version__ = "0.2.0"
