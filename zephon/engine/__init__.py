"""Runtime: runners, sequence reorder, per-lane accumulators, sentinels, tail multiplexer, replay."""
from .exports import lazy_exports

# imported on first use (zephon.engine.exports): a processes-runner worker needs only the stage and the runners
__getattr__, __dir__ = lazy_exports(__name__, {
    "GlobalBatchHasher": ".hashing", "row_digests": ".hashing", "Loader": ".loader", "empty_row": ".tail",
    "LoaderPlan": ".plan", "WorkStage": ".stage",
    **{name: ".runners" for name in ("RUNNERS", "InlineRunner", "ProcessRunner", "Runner", "ThreadRunner",
                                      "make_runner")}})

__all__ = ["GlobalBatchHasher", "InlineRunner", "Loader", "LoaderPlan", "ProcessRunner", "RUNNERS", "Runner",
           "ThreadRunner", "WorkStage", "empty_row", "make_runner", "row_digests"]
