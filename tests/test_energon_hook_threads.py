"""zephon_energon's hook context (Energon's process-wide worker context) on several threads at once.

With a threads runner, hooks run on a worker thread, the dispatcher (packing, grouping) and the consumer (batching)
at the same time. Oracle: the indexes each thread asked for, and Energon's class attributes read before any hook ran.
"""
from __future__ import annotations

import threading
import time

import pytest

pytest.importorskip("megatron.energon")

from megatron.energon import WorkerConfig  # noqa: E402
from zephon_energon._hooks import energon_context  # noqa: E402


def test_hook_contexts_on_threads_see_their_own_index_and_restore_energons():
    before = (WorkerConfig.active_worker_config, WorkerConfig._sample_index_stack,
              WorkerConfig._worker_override_global_rank)
    wrong, errors = [], []

    def run(base: int):
        try:
            for i in range(150):
                with energon_context(0, base + i):
                    time.sleep(0.0002)  # another thread gets the GIL inside the context
                    if WorkerConfig._sample_index_stack[-1] != base + i:
                        wrong.append((base + i, list(WorkerConfig._sample_index_stack)))
        except Exception as e:  # an assertion of Energon's worker_activate, seen from the test thread
            errors.append(repr(e))

    threads = [threading.Thread(target=run, args=(k * 10_000,)) for k in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors, errors[:3]
    assert not wrong, f"{len(wrong)} hooks saw another thread's sample index, e.g. {wrong[:3]}"
    after = (WorkerConfig.active_worker_config, WorkerConfig._sample_index_stack,
             WorkerConfig._worker_override_global_rank)
    assert after == before  # nothing left active for Energon's own loaders
