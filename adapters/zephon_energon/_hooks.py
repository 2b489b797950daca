"""TaskEncoder hooks as Energon runs them: its worker context, its error handling, its generator results.

Every hook runs with an Energon worker context whose sample index is the element's global stream
position (a pure function of the config), so ``@stateless(restore_seeds=True)`` hooks and
``current_sample_index`` give the same values whatever the world size, worker count or resume point.
A hook that raises ``SkipSample`` drops its element (counted); other errors go to Energon's
``global_error_handler`` or name the file, shard and sample.
"""
from __future__ import annotations

import threading
from contextlib import contextmanager
from types import GeneratorType

from megatron.energon import SkipSample, WorkerConfig

from zephon.ops import RecordError
from zephon.formats.records import ENERGON_SKIP as SKIP
from zephon.formats.records import SRC, first_piece


def qualname(obj) -> str:
    """``module.Class`` of an object or class (for fingerprints and messages)."""
    t = obj if isinstance(obj, type) else type(obj)
    return f"{t.__module__}.{t.__qualname__}"


def fn_name(fn) -> str:
    """``module.qualname`` of a function or bound method (for fingerprints and messages)."""
    fn = getattr(fn, "__func__", fn)
    return f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', repr(fn))}"


def overridden(task_encoder, name: str) -> bool:
    """Whether ``task_encoder`` overrides hook ``name`` of Energon's base classes (as Energon decides)."""
    from megatron.energon import DefaultTaskEncoder, TaskEncoder

    return task_encoder._is_overridden(getattr(task_encoder, name), bases=(TaskEncoder, DefaultTaskEncoder)) \
        if name == "encode_sample" else task_encoder._is_overridden(getattr(task_encoder, name))


# -- the Energon worker context ----------------------------------------------------------------
_CONTEXTS: dict[int, WorkerConfig] = {}
# Energon keeps the active worker context in class attributes (one per process), and hooks run on several threads (a
# threads runner's worker, the dispatcher's accumulators, the consumer's batching): one hook at a time, or a thread
# would read another's sample index and restore another's context on exit (left active for Energon's own loaders).
_CONTEXT_LOCK = threading.RLock()


@contextmanager
def energon_context(seed_offset: int, index: int):
    """Activate an Energon worker context (so ``current_sample_index``, ``restore_seeds`` and
    ``WorkerConfig.active_worker_config`` work in user hooks) whose worker identity is fixed and whose
    sample index is ``index``: hook randomness then depends on the element, never on the topology."""
    with _CONTEXT_LOCK:
        cfg = _CONTEXTS.get(seed_offset)
        if cfg is None:
            cfg = _CONTEXTS[seed_offset] = WorkerConfig(rank=0, world_size=1, num_workers=1, seed_offset=seed_offset)
        outer = WorkerConfig.active_worker_config, WorkerConfig._sample_index_stack, \
            WorkerConfig._worker_override_global_rank
        WorkerConfig.active_worker_config = None
        # override_global_rank=1 (truthy): worker 1 % 1 == 0 of a 1-worker rank, in or out of a DataLoader worker.
        cfg.worker_activate(int(index), override_global_rank=1)
        try:
            yield
        finally:
            WorkerConfig.active_worker_config, WorkerConfig._sample_index_stack, \
                WorkerConfig._worker_override_global_rank = outer


def element_index(record) -> int:
    """The global stream position of a record (a pack's: its first member's), the hooks' sample index."""
    src = record[SRC]
    return first_piece(record).position if src or not isinstance(src, list) else 0


def call_hook(hook, arg, record, error_handler, what: str):
    """Run a user hook. ``SkipSample`` -> ``None`` (dropped, counted). Other exceptions go to Energon's
    ``global_error_handler``: if it returns, the element is dropped and counted; if it raises, the error
    names the file, shard and sample (``RecordError``)."""
    try:
        return hook(arg)
    except SkipSample:
        return None
    except Exception as e:  # user code sees bad data first: name the sample
        if error_handler is not None:
            try:
                error_handler(e, arg, _sources(arg))
                return None
            except Exception:
                pass
        raise RecordError(f"{what} failed: {type(e).__name__}: {e}", record) from e


def _sources(sample):
    try:
        from megatron.energon.source_info import get_source_info
        return get_source_info(sample)
    except Exception:
        return None


def expand_result(result, record, handler, what):
    """A hook result as a list: a generator yields 0..n elements, ``None`` (skipped) gives none."""
    if result is None:
        return []
    if not isinstance(result, GeneratorType):
        return [result]
    out = []
    try:
        for item in result:
            out.append(item)
    except SkipSample:
        pass
    except Exception as e:
        if handler is not None:
            try:
                handler(e, record, None)
                return out
            except Exception:
                pass
        raise RecordError(f"{what} failed: {type(e).__name__}: {e}", record) from e
    return out


def keep(record) -> bool:
    """Filter function: drop the markers of skipped samples (the engine counts them as filtered)."""
    return SKIP not in record
