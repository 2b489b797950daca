"""Checkpoint bookkeeping on the consuming side of a host loader.

Host loaders (torch's DataLoader, Composer, Energon) run the pipeline in worker processes that
prefetch ahead of training. The exact checkpoint is what the training loop consumed, so workers
attach each lane's entry to its micro-batches (``Loader(emit_state=True)``) and the consuming
process records the latest entry per lane here. Worker count and prefetch depth never enter it.
"""
from __future__ import annotations

from .. import checkpoint as ckpt
from ..formats.records import STATE


def initial_state(plan) -> dict:
    """The checkpoint of ``plan``'s rank before anything was delivered (every lane of ``rank_lanes``)."""
    return plan.make_state(ckpt.initial_lanes(plan.rank_lanes))


class Progress:
    """The rank's checkpoint as of the micro-batches consumed so far.

    Args:
        plan: the rank's ``engine.LoaderPlan`` (config, lanes).
        start: the rank's checkpoint to count from (every lane of ``plan.rank_lanes``; validated by the caller).
    ``observe(mb)`` pops ``__state__`` from a consumed micro-batch (``record(entry)`` takes the entry
    itself). A consuming generator stores the entries of what it is about to yield in ``handed`` (a plain
    attribute store right before its ``yield``: nothing can raise in between) and calls ``commit()`` when it
    resumes; ``checkpoint()`` counts what was handed (the consumer has it), so an exception anywhere between
    two yields neither skips nor repeats a micro-batch. ``checkpoint()`` returns the rank's checkpoint dict
    (every lane of ``plan.rank_lanes``), as ``Loader.checkpoint`` would."""

    def __init__(self, plan, start: dict):
        self.plan = plan
        self.reset(start)

    def reset(self, start: dict) -> None:
        """Start again from the rank checkpoint ``start``."""
        # entries as ``LaneCursor.to_dict`` writes them (what micro-batches carry): ``lane_entries`` needs no parsing
        self.entries = {c.lane: c.to_dict() for c in map(ckpt.LaneCursor.from_dict, start["lanes"])}
        self.handed: list[dict] = []  # entries of the item(s) last yielded to the training loop, uncommitted

    def observe(self, mb: dict) -> dict:
        """Record the lane entry carried by micro-batch ``mb`` (removed from it); returns ``mb``.
        Raises ``KeyError`` if ``mb`` has no ``__state__`` (the loader lacks ``emit_state=True``)."""
        self.record(mb.pop(STATE))
        return mb

    def record(self, entry: dict) -> None:
        """Record one lane's checkpoint entry (its state once a micro-batch was consumed)."""
        if entry["lane"] not in self.entries:
            raise ValueError(f"micro-batch of lane {entry['lane']}, which this rank does not own")
        self.entries[entry["lane"]] = entry

    def commit(self) -> None:
        """Record the ``handed`` entries (the consumer has their items). Interrupt-safe: recording is
        idempotent (an entry replaces its lane's), and ``handed`` is cleared only once all are recorded."""
        for entry in self.handed:
            self.record(entry)
        self.handed = []

    def cursors(self) -> list:
        """The rank's ``LaneCursor``s (every lane of ``plan.rank_lanes``, in lane order), handed items included."""
        self.commit()
        return [e if isinstance(e, ckpt.LaneCursor) else ckpt.LaneCursor.from_dict(e)
                for _, e in sorted(self.entries.items())]

    def checkpoint(self) -> dict:
        """The rank's checkpoint dict (every lane of ``plan.rank_lanes``), handed items included."""
        return self.plan.make_state(self.cursors())

    def lane_entries(self) -> list[dict]:
        """``checkpoint()["lanes"]`` without building the checkpoint (no parsing, no digest: a host publishing the
        entries every step pays only a sort). The entries are the recorded dicts themselves: read-only."""
        self.commit()
        return [e for _, e in sorted(self.entries.items())]
