"""Runtime: runners, sequence reorder, per-lane accumulators, sentinels, tail multiplexer, replay,
checkpoint state."""
from .assembly import StepAssembly
from .checkpoint import CheckpointError, merge_states
from .hashing import GlobalBatchHasher, row_digests
from .loader import Loader
from .progress import Progress
from .runners import RUNNERS, InlineRunner, ProcessRunner, Runner, ThreadRunner, make_runner
from .stage import WorkStage

__all__ = ["RUNNERS", "CheckpointError", "StepAssembly", "GlobalBatchHasher", "InlineRunner", "Loader", "ProcessRunner", "Progress", "Runner",
           "ThreadRunner", "WorkStage", "make_runner", "merge_states", "row_digests"]
