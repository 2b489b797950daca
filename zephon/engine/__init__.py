"""Runtime: runners, sequence reorder, per-lane accumulators, sentinels, tail multiplexer, replay."""
from ..checkpoint import CheckpointError, merge_states  # old import path, kept for users
from .hashing import GlobalBatchHasher, row_digests
from .loader import Loader, empty_row
from .plan import LoaderPlan
from .runners import RUNNERS, InlineRunner, ProcessRunner, Runner, ThreadRunner, make_runner
from .stage import WorkStage

__all__ = ["RUNNERS", "CheckpointError", "GlobalBatchHasher", "InlineRunner", "Loader", "LoaderPlan",
           "ProcessRunner", "Runner", "ThreadRunner", "WorkStage", "empty_row", "make_runner", "merge_states",
           "row_digests"]
