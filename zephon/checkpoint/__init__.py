"""Checkpoints: the state schema (plain JSON, a typed lane cursor, config fingerprint and algorithm version),
merging rank states, and aggregation across ranks (torch.distributed, a shared directory, or in-process).

Every rank's ``Loader.checkpoint()`` holds its lanes; ``merge_states`` / ``gather_checkpoint`` make the
global checkpoint that any dp_degree dividing ``canonical_replicas`` restores. Never pickle: loading a
checkpoint must not run code. See docs/concepts.md.
"""
from .aggregate import AggregationError, Aggregator, LocalAggregator
from .gather import gather_checkpoint
from .merge import merge_rank_states, merge_states
from .schema import (ALGORITHM_VERSION, FORMAT, LANE_KEYS, CheckpointError, LaneCursor, canonical_json,
                     check_given, config_diff,
                     config_digest, digest, first_step, initial_lanes, lane_ranges, make_state, summarize_config,
                     validate)
from .skips import skip_in_state
from .shared_dir import DirectoryAggregator, committed_rounds, latest_checkpoint
from .torch_dist import TorchDistAggregator

__all__ = ["ALGORITHM_VERSION", "AggregationError", "Aggregator", "CheckpointError", "DirectoryAggregator", "FORMAT",
           "LANE_KEYS", "LaneCursor", "LocalAggregator", "TorchDistAggregator", "canonical_json", "check_given",
           "committed_rounds",
           "config_diff", "config_digest", "digest", "first_step", "gather_checkpoint", "initial_lanes", "lane_ranges",
           "latest_checkpoint", "make_state", "merge_rank_states", "merge_states", "skip_in_state", "summarize_config",
           "validate"]
