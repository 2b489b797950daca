"""What every host loader needs, once: a worker's lanes (its part of a rank's lanes), reassembly of lane micro-batches
in the consuming process with the consumed-state record, end-of-stream agreement across ranks, the
rank's initial, partial and merged checkpoints, per-rank entries restored selectively (``ranks``), whole
rank steps from workers that each compute a share of the lanes (``exchange``), global sample ids for hosts that
index samples (``items``) and a side channel from
workers to the main process (``channel``). Adapters (``adapters/zephon_*``) translate host keywords, sample
shapes and state shapes onto ``RankSession``; see docs/concepts.md.
"""
from ..checkpoint import CheckpointError, gather_checkpoint, merge_rank_states, skip_in_state
from ..engine.explain import explain
from .agreement import StepAgreement, agreed_steps
from .assembly import StepAssembly
from .channel import Channel, private_dir
from .exchange import StepExchange, exchange_steps, worker_steps
from .items import SampleItems
from .ranks import (RANK_FORMAT, SavedRanks, gather_rank_states, load_rank_states, rank_checkpoint, rank_entries_needed,
                    restorable, save_rank_state)
from .progress import Progress, initial_state
from .session import RankSession
from .workers import worker_lanes
from .states import decode_state, encode_state, state_capacity
from .metrics import every, flatten, format_metrics, prometheus_text, serve_prometheus, to_tensorboard

__all__ = ["RANK_FORMAT", "SavedRanks", "gather_rank_states", "load_rank_states", "rank_checkpoint",
           "rank_entries_needed", "restorable", "save_rank_state",
           "Channel", "CheckpointError", "Progress", "RankSession", "SampleItems", "StepAgreement", "StepAssembly",
           "StepExchange", "agreed_steps", "decode_state", "encode_state", "every", "exchange_steps", "explain",
           "flatten", "format_metrics", "gather_checkpoint", "initial_state", "merge_rank_states", "private_dir",
           "prometheus_text", "serve_prometheus", "skip_in_state", "state_capacity", "to_tensorboard", "worker_lanes",
           "worker_steps"]
