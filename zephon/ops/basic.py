"""Stateless record operators: decode (select a text field), map, filter."""
from __future__ import annotations

from ..formats.records import FieldError, field_text
from .base import Operator, RecordError


def _callable_name(fn) -> str:
    return f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', repr(fn))}"


def text_of(record: dict, field: str) -> str:
    """Field ``field`` of ``record`` as text (``zephon.formats.records.field_text``'s rule, as ``Decode`` applies it).

    record: a reader's record. field: a column, Energon field_map field or part.
    Returns the str. Raises ``RecordError`` (with the record's identity) when the field is missing, not text,
    or not valid UTF-8."""
    try:
        return field_text(record, field)
    except FieldError as e:
        raise RecordError(str(e), record) from None


class Decode(Operator):
    """Take field ``field`` of each record as text: ``str`` passes, ``bytes`` are decoded as UTF-8.

    Output records: ``{field: str, "__src__": ...}`` (other columns dropped unless ``keep`` lists them).
    Raises ``RecordError`` (file, shard and sample named by the engine) when the field is missing, not
    text, or not valid UTF-8."""

    name = "decode"

    def __init__(self, field: str = "text", keep: tuple[str, ...] = ()):
        self.field = field
        self.keep = tuple(keep)

    def fingerprint(self) -> dict:
        return {"op": self.name, "field": self.field, "keep": list(self.keep)}

    def process_many(self, records: list[dict]) -> list[dict]:
        out = []
        f = self.field
        for r in records:
            rec = {f: text_of(r, f), "__src__": r["__src__"]}
            for k in self.keep:
                rec[k] = r.get(k)
            out.append(rec)
        return out


class _FnOperator(Operator):
    """An operator around a user function ``fn(record)``; ``name`` (default: its qualified name) enters
    the fingerprint. ``fn`` must be deterministic, and picklable (module-level) for ``processes``."""

    def __init__(self, fn, name: str | None = None):
        self.fn = fn
        self.label = name or _callable_name(fn)

    def fingerprint(self) -> dict:
        return {"op": self.name, "fn": self.label}

    def _call(self, r: dict):
        try:
            return self.fn(r)
        except Exception as e:  # name the sample: user code sees bad data first
            raise RecordError(f"{self.name} {self.label} failed: {type(e).__name__}: {e}", r) from e


class Map(_FnOperator):
    """Apply ``fn(record) -> record`` to each record (``__src__`` is carried over when ``fn`` drops it).
    Raises ``RecordError`` naming the record when ``fn`` raises."""

    name = "map"

    def process_many(self, records: list[dict]) -> list[dict]:
        out = []
        for r in records:
            new = self._call(r)
            if not isinstance(new, dict):
                raise RecordError(f"map {self.label} returned {type(new).__name__}, expected a dict record", r)
            new.setdefault("__src__", r["__src__"])
            out.append(new)
        return out


class Filter(_FnOperator):
    """Keep records where ``fn(record)`` is true. Dropped records are counted by the engine
    (``stats()["filtered"]``), never silently lost. Raises ``RecordError`` when ``fn`` raises."""

    name = "filter"

    def process_many(self, records: list[dict]) -> list[dict]:
        return [r for r in records if self._call(r)]
