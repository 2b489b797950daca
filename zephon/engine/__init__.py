"""Runtime: runners, sequence reorder, per-lane accumulators, sentinels, tail multiplexer, replay."""
from .hashing import GlobalBatchHasher, row_digests
from .loader import Loader
from .tail import empty_row
from .plan import LoaderPlan
from .runners import RUNNERS, InlineRunner, ProcessRunner, Runner, ThreadRunner, make_runner
from .stage import WorkStage

__all__ = ["GlobalBatchHasher", "InlineRunner", "Loader", "LoaderPlan", "ProcessRunner", "RUNNERS", "Runner",
           "ThreadRunner", "WorkStage", "empty_row", "make_runner", "merge_states", "row_digests"]
