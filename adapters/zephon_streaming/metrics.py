"""``Loader.metrics()`` in Composer's logger: a ``composer.Callback`` that logs the flattened metrics every
``n`` batches (translation only: the numbers come from ``zephon.host.metrics.flatten``). See docs/metrics.md."""
from __future__ import annotations

from zephon.host import flatten

try:  # composer is optional: without it the class keeps the same methods, for any caller of batch_end
    from composer.core import Callback as _Base
except ImportError:  # pragma: no cover - exercised where composer is absent
    _Base = object


class ZephonMetrics(_Base):
    """Composer callback: ``logger.log_metrics(flatten(metrics_fn()))`` every ``every_n_batches`` batches and at the
    end of each epoch.

    Args:
        metrics_fn: returns ``Loader.metrics()``-shaped data, e.g. ``loader.metrics`` of the loader feeding training.
        every_n_batches: batches between two logs (>= 1).
        prefix: the metric names' first part (``zephon/datasets/web/tokens``).
    Raises ``ValueError`` for ``every_n_batches`` < 1."""

    def __init__(self, metrics_fn, every_n_batches: int = 100, prefix: str = "zephon"):
        if every_n_batches < 1:
            raise ValueError(f"every_n_batches must be >= 1, got {every_n_batches}")
        self.metrics_fn, self.every, self.prefix = metrics_fn, every_n_batches, prefix
        self.batches = 0

    def batch_end(self, state, logger) -> None:
        self.batches += 1
        if self.batches % self.every == 0:
            logger.log_metrics(flatten(self.metrics_fn(), self.prefix))

    def epoch_end(self, state, logger) -> None:
        logger.log_metrics(flatten(self.metrics_fn(), self.prefix))
