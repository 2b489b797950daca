"""Runtime: runners, sequence reorder, per-lane accumulators, sentinels, tail multiplexer, replay."""
from .exports import lazy_exports

# imported on first use (zephon.engine.exports): a processes-runner worker needs only the stage and the runners
_EXPORTS = {
    "GlobalBatchHasher": ".hashing", "row_digests": ".hashing", "Loader": ".loader", "empty_row": ".tail",
    "LoaderPlan": ".plan", "WorkStage": ".stage",
    **{name: ".runners" for name in ("RUNNERS", "InlineRunner", "ProcessRunner", "Runner", "ThreadRunner",
                                      "make_runner")}}
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
__all__ = sorted(_EXPORTS)  # the public names are the exports, one list
