"""Energon keywords zephon_energon honours, refuses or warns about, and the Zephon keywords it adds.

Every refusal raises ``RefusedKeyword`` whose message names the keyword and why; ``ZephonEnergonWarning``
flags a configuration that runs but is probably not what was meant. See docs/energon.md.
"""
from __future__ import annotations

import warnings

from megatron.energon.errors import reraise_exception

#: Zephon keywords accepted on top of Energon's (documented in docs/energon.md).
#: ``schedule_step_size``: samples per step of a metadataset's weight schedule (default: one batch per lane).
#: ``group_max_carry``: rows of short group buckets a lane carries across a flush sentinel (grouped batching).
ZEPHON_KEYWORDS = ("canonical_replicas", "chunk_size", "flush_span", "lane_assignment", "schedule_step_size",
                   "group_max_carry")
DEFAULT_CANONICAL_REPLICAS = 64


class RefusedKeyword(ValueError):
    """An Energon keyword (or value) zephon_energon cannot honour; the message says why."""


class ZephonEnergonWarning(UserWarning):
    """A configuration zephon_energon runs but that is probably not what was meant (the message says why
    and what to set)."""


def refuse(name, reason):
    """Raise ``RefusedKeyword`` for keyword ``name`` (``reason``: why, and what to do instead)."""
    raise RefusedKeyword(f"{name}: {reason}")


def check_worker_config(wc) -> None:
    """Check Energon's ``WorkerConfig`` (``rank``, ``world_size``, ``num_workers`` ints >= 0). Raises
    ``ValueError`` for a missing or malformed one, ``RefusedKeyword`` for its per-worker debug log."""
    if wc is None:
        raise ValueError("worker_config is required (WorkerConfig(rank=, world_size=, num_workers=)), as in Energon")
    for attr in ("rank", "world_size", "num_workers"):
        v = getattr(wc, attr, None)
        if not isinstance(v, int) or v < 0:
            raise ValueError(f"worker_config.{attr} must be an int >= 0, got {v!r}")
    if getattr(wc, "worker_debug_path", None) is not None or getattr(wc, "worker_log_level", 0):
        refuse("worker_config.worker_debug_path/worker_log_level", "Energon's per-worker debug log is not written by "
               "zephon_energon; Loader statistics come from SavableDataLoader.stats()")


def error_handler(wc):
    """The hook error handler: Energon's ``global_error_handler`` (default: log and skip the sample)."""
    h = getattr(wc, "global_error_handler", None)
    return None if h is None or h is reraise_exception else h


def deprecated_keywords(kwargs, task_encoder) -> None:
    """Energon's deprecated keywords, handled as Energon 7.4 does: ``handler`` is ignored with a warning;
    ``auto_decode=False`` drops the decoder; ``image_decode``/``av_decode``/``video_decode_audio`` set a
    ``SampleDecoder`` on the task encoder (refused if it already has a different one)."""
    if "handler" in kwargs:
        kwargs.pop("handler")
        warnings.warn("handler is deprecated in Energon and ignored (as Energon does): errors in TaskEncoder hooks go "
                      "to worker_config.global_error_handler", DeprecationWarning, stacklevel=4)
    from megatron.energon.task_encoder.loader import _split_deprecated_dataset_kwargs

    dec = {k: kwargs.pop(k) for k in ("auto_decode", "image_decode", "av_decode", "video_decode_audio")
           if k in kwargs}
    _split_deprecated_dataset_kwargs(dec, task_encoder, None)
