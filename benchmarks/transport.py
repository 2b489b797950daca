"""Worker transport: records/s through a ProcessRunner with pickle against shared memory, and inline.

    python -m benchmarks --only transport [--quick]

Each unit is 64 records of one 224x224x3 float32 array; the parent stacks each unit's arrays (as collate
does, reading every byte). Prints a table; asserts nothing.
"""
from __future__ import annotations

import time

import numpy as np

from zephon.engine.runners import InlineRunner, ProcessRunner
from zephon.engine.stage import UnitResult


class ImageStage:
    """A stage whose every unit is ``records`` records of one 224x224x3 float32 array (transport only)."""

    datasets: list = []

    def __init__(self, records: int = 64, shape=(224, 224, 3)):
        self.records, self.shape = records, shape

    def run(self, ptrs) -> UnitResult:
        return UnitResult(records=[{"image": np.full(self.shape, float(ptrs) + i, np.float32), "id": (ptrs, i)}
                                   for i in range(self.records)])


def measure_transport(units: int = 40, records: int = 64, workers: int = 2) -> list:
    """Records/s of ``units`` units through a ``ProcessRunner`` with pickle vs shared-memory transport
    (the pump stacks each unit's arrays, as collate does), and of the same work inline (no transport).
    Returns rows ``(transport, records, seconds, records/s)``."""
    rows = []
    for label, threshold in (("inline (none)", "inline"), ("pickle", None), ("shared memory", 64 * 1024)):
        stage = ImageStage(records)
        r = InlineRunner(stage) if threshold == "inline" else ProcessRunner(stage, workers, shm_threshold=threshold)
        try:
            r.submit(-1).result()  # warm up
            t0 = time.perf_counter()
            futures = [r.submit(u) for u in range(units)]
            for u, f in enumerate(futures):
                res = f.result()
                batch = np.stack([rec["image"] for rec in res.records])  # what collate does: reads every byte
                assert batch[-1, 0, 0, 0] == u + records - 1
                del res, batch
            dt = time.perf_counter() - t0
        finally:
            r.close()
        rows.append((label, units * records, dt, units * records / dt))
    return rows

def main(workdir: str, quick: bool) -> str:
    """Print the table (``python -m benchmarks --only transport``); ``workdir`` is unused (no corpus)."""
    rows = measure_transport(units=10 if quick else 40)
    lines = [f"unit = 64 records x 224x224x3 float32 ({64 * 224 * 224 * 3 * 4 / 2**20:.1f} MiB), 2 workers",
             f"{'transport':<14} {'records':>8} {'seconds':>8} {'records/s':>10}"]
    lines += [f"{label:<14} {n:>8} {dt:>8.2f} {rate:>10.0f}" for label, n, dt, rate in rows]
    out = "\n".join(lines)
    print(out)
    return out
