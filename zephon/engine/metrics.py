"""``Loader.metrics()``: what the loader did and where its time went, counted as it runs (a few additions per unit
of work and per micro-batch, always on). Exporters (callback, TensorBoard, Prometheus) are in
``zephon.host.metrics``; see docs/metrics.md.
"""
from __future__ import annotations

import threading
import time

import numpy as np

from ..formats.remote import stats as remote_stats


class MetricsCounter:
    """The counts behind ``Loader.metrics()`` (one per Loader; they survive its iterations and restores).

    num_datasets: datasets of the loader. Workers' per-unit counts arrive through ``add_unit`` (on the pump), the
    pump's own time through ``add_pump``, delivered micro-batches through ``add_micro_batch``, the consumer's wait
    through ``add_wait``."""

    def __init__(self, num_datasets: int):
        self._lock = threading.Lock()  # metrics() may be read from another thread (a Prometheus endpoint)
        self.started = time.perf_counter()
        self.samples = [0] * num_datasets   # documents out of the worker stage (first pieces), per dataset
        self.tokens = [0] * num_datasets    # their tokens
        self.units = 0
        self.stage_s: dict[str, float] = {}  # seconds per stage: read, each worker operator, each pump operator
        self.worker_s = 0.0                  # seconds workers spent on units (all stages)
        self.rows = self.padding_rows = self.micro_batches = 0
        self.row_tokens = self.row_slots = 0  # tokens in delivered rows, and their capacity (rows x row length)
        self.wait_s = 0.0                     # seconds the consumer waited inside next()

    def add_unit(self, res) -> None:
        """Count a worker's ``UnitResult`` as the pump releases it."""
        with self._lock:
            self.units += 1
            for d, n in res.samples_by.items():
                self.samples[d] += n
            for d, n in res.tokens_by.items():
                self.tokens[d] += n
            for name, s in res.times.items():
                self.stage_s[name] = self.stage_s.get(name, 0.0) + s
                self.worker_s += s

    def add_pump(self, name: str, seconds: float) -> None:
        """``seconds`` the pump spent in accumulator ``name``."""
        with self._lock:
            self.stage_s[name] = self.stage_s.get(name, 0.0) + seconds

    def add_micro_batch(self, mb: dict, n_real: int, n_pad: int) -> None:
        """A micro-batch handed to the consumer: ``n_real`` rows of data, ``n_pad`` padding rows."""
        ids, mask = mb.get("input_ids"), mb.get("attention_mask")
        width = ids.shape[-1] if isinstance(ids, np.ndarray) and ids.ndim == 2 else 0
        tokens = int(mask[:n_real].sum()) if isinstance(mask, np.ndarray) and width else 0
        with self._lock:
            self.micro_batches += 1
            self.rows += n_real
            self.padding_rows += n_pad
            self.row_tokens += tokens
            self.row_slots += n_real * width

    def add_wait(self, seconds: float) -> None:
        with self._lock:
            self.wait_s += seconds

    def snapshot(self, *, names: list[str], target: list[float], workers: int, skipped: int, filtered: int) -> dict:
        """The metrics as plain data (see ``Loader.metrics``)."""
        with self._lock:
            elapsed = max(time.perf_counter() - self.started, 1e-9)
            total_s, total_t = sum(self.samples), sum(self.tokens)
            datasets = {name: {"samples": self.samples[d], "tokens": self.tokens[d],
                               "sample_share": self.samples[d] / total_s if total_s else 0.0,
                               "token_share": self.tokens[d] / total_t if total_t else 0.0,
                               "target_share": target[d]}
                        for d, name in enumerate(names)}
            remote = remote_stats()
            return {
                "elapsed_s": elapsed,
                "datasets": datasets,
                "rows": self.rows, "micro_batches": self.micro_batches, "padding_rows": self.padding_rows,
                "tokens": self.row_tokens,
                "padding_tokens": self.row_slots - self.row_tokens,
                "padding_fraction": 1 - self.row_tokens / self.row_slots if self.row_slots else 0.0,
                "skipped": skipped, "filtered": filtered,
                "stage_s": dict(self.stage_s),
                "consumer_wait_s": self.wait_s,
                "consumer_wait_fraction": self.wait_s / elapsed,
                "worker_utilization": self.worker_s / (elapsed * max(1, workers)),
                "units": self.units,
                "remote": {"downloads": remote["downloads"], "downloaded_bytes": remote["downloaded_bytes"],
                           "range_reads": remote["range_reads"], "range_bytes": remote["range_bytes"]},
            }
