"""Operator and accumulator protocols.

An operator is a pipeline step. Stateless operators implement ``process_many(records) -> records``:
they may run on any worker, in any order, in batches of any size, and must give the same output per
record regardless. Stateful operators implement ``new_accumulator(lane) -> Accumulator``: the per-lane,
in-order state (packing bins, shuffle buffer, mixture deficits) that runs on the pump only.

Records are dicts. Keys starting and ending with ``__`` are metadata the engine sets and reads, declared
once in ``zephon.formats.records``: ``__src__`` is a source sample's identity (``Src``: dataset, shard,
sample, position), or a list of ``PieceRef`` (position, piece) for a row built from several.
"""
from __future__ import annotations

from ..formats import records
from ..formats.records import SRC, Src


def field_value(record: dict, name: str):
    """Field ``name`` of a record (``zephon.formats.records.field_value``'s lookup: column, field_map field, part).

    record: a reader's record. name: the field.
    Raises ``RecordError`` (with the record's identity) naming what the record holds when none has it.
    """
    try:
        return records.field_value(record, name)
    except records.FieldError as e:
        raise RecordError(str(e), record) from None


class RecordError(ValueError):
    """An operator could not process a record. The engine turns it into a ``DataError`` naming the
    file, shard and sample from the record's ``__src__``."""

    def __init__(self, message: str, record: dict | None = None):
        super().__init__(message)
        src = record.get(SRC) if isinstance(record, dict) else None
        # a single sample's identity (a user Map may have rebuilt it as a plain tuple); a combined row has none
        self.src = Src(*src) if isinstance(src, tuple) and len(src) == 4 else None


class Operator:
    """Base class: ``name`` and ``fingerprint()`` (plain JSON data; part of the checkpoint identity, so
    a checkpoint made with other operator settings is refused)."""

    name = "operator"

    def fingerprint(self) -> dict:
        return {"op": self.name}

    #: An accumulator that only reorders or holds records, never changes one (a shuffle buffer): records
    #: carried across a sentinel by a later accumulator are regenerated without it.
    reorders_only = False

    @property
    def stateful(self) -> bool:
        return hasattr(self, "new_accumulator")


class Accumulator:
    """Per-lane, in-order state of a stateful operator.

    ``push(record) -> list[record]`` returns what is ready; ``flush() -> list[record]`` empties the
    state at a flush sentinel (or the end of the lane) and returns everything left, so after a flush
    the accumulator is as new. Outputs must be a pure function of the records pushed since the last
    flush and their order.

    An accumulator may also carry state across a flush sentinel: ``carry() -> (records, held)`` emits what
    it must and returns ``held``, lists of the records it keeps (named by identity in the checkpoint), and
    ``resume(held)`` rebuilds that state from the same records regenerated. Its outputs are then a pure
    function of the carried records and those pushed since (``ops.pack.PackAccumulator``)."""

    def push(self, record: dict) -> list[dict]:
        raise NotImplementedError

    def flush(self) -> list[dict]:
        raise NotImplementedError
