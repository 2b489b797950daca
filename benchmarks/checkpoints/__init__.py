"""Checkpoint cost: what a saved state weighs and what a restore costs, three ways.

* ``peers`` (side-by-side comparison 4, ``python -m benchmarks --only checkpoints``): checkpoint size and time to
  first batch after a restore at several steps, Zephon against Grain, torchdata, Energon and Streaming.
* ``cost`` (``--only checkpoint-cost``): Zephon's checkpoint size and resume cost against training length and
  chunk size, on the tokenize + pack demo pipeline.
* ``restore`` (``--only restore``): restore against cold start as the shuffle buffer grows, core and Energon.

Every restore is checked against the uninterrupted run's next batch by ``digest``.
"""
from __future__ import annotations

import hashlib


def digest(texts) -> str:
    """A short hex digest of a batch's texts (or bytes), in order.

    texts: the batch's documents (str or bytes-like), in delivery order.
    """
    h = hashlib.sha256()
    for t in texts:
        h.update(t.encode("utf-8") if isinstance(t, str) else bytes(t))
        h.update(b"\0")
    return h.hexdigest()[:16]
