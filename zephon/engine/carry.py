"""Records a packing accumulator carries across a flush sentinel: their names in a checkpoint entry's ``carry``
(stream positions, pieces, token offsets), which operators carry, and the unit that regenerates them on resume
(``lane.LanePipeline``)."""
from __future__ import annotations

from ..formats.records import OFFSET, piece_ref


def record_ref(record: dict):
    """A carried record's name in a checkpoint: its stream position, or ``[position, piece]`` for a piece
    of a split document after the first, or ``[position, piece, offset]`` for a record whose first ``offset``
    tokens were delivered already (``OFFSET``: concat packing carries a document cut mid-way)."""
    position, piece = piece_ref(record)
    offset = record.get(OFFSET, 0)
    if offset:
        return [position, piece, offset]
    return position if piece == 0 else [position, piece]


def ref_key(ref) -> tuple[int, int]:
    return (ref, 0) if isinstance(ref, int) else (ref[0], ref[1])


def ref_record(ref, by_ref: dict) -> dict:
    """The regenerated record ``ref`` names (``by_ref``: piece identity -> record), with its ``OFFSET`` if any."""
    record = by_ref[ref_key(ref)]
    return {**record, OFFSET: ref[2]} if isinstance(ref, list) and len(ref) == 3 else record


def carrier_indexes(chain_ops) -> set[int]:
    """Indexes of the pump-side operators whose accumulators carry across a sentinel: those with ``carry``
    whose records can be regenerated (only reordering accumulators before them)."""
    out = set()
    for i, op in enumerate(chain_ops):
        if op.stateful and hasattr(op.new_accumulator(0), "carry") and all(
                o.reorders_only for o in chain_ops[:i] if o.stateful):
            out.add(i)
    return out


class Carried:
    """The unit that regenerates the records carried into a resumed span (released before anything else)."""

    def __init__(self, future):
        self.future = future

    def done(self) -> bool:
        return self.future.done()
