"""The reserved keys of a record and of a micro-batch, declared once, and the sample identity they carry.

A record is a dict; keys that start and end with ``__`` are Zephon's, every other key is the user's data.
Energon declares its reserved sample keys the same way (``__key__``, ``__restore_key__``, ... in one
TypedDict). Identities are NamedTuples, so they read by field and still serialize as plain JSON lists.
See docs/concepts.md ("Words").
"""
from __future__ import annotations

from typing import NamedTuple

# --- keys of a record (readers -> operators -> accumulators) ---
SRC = "__src__"          # where the record came from: a Src, or a list of PieceRef for a row built from several
PIECE = "__piece__"      # piece number of a long document split by Tokenize (0 for the first or only piece)
OFFSET = "__offset__"    # tokens of a carried record already delivered (concat packing cuts documents across rows)
DOC_OFFSETS = "__doc_offsets__"  # explain's concat rows: per piece, its first token's offset in its document
ERROR = "__error__"      # a reader's message for a bad sample in on_error="skip" mode (the record is skipped)
SHARD = "__shard__"      # shard file name a reader record came from (error messages, inspect)
KEY = "__key__"          # the sample's own key (Energon / WebDataset ``__key__``, MDS and JSONL none)
RESTORE_KEY = "__restore_key__"  # Energon's restore index ``["Webdataset", index over the split's tars]``
SHARD_IDX = "__shard_idx__"      # Energon reader: the shard index that was read
SAMPLE_IDX = "__sample_idx__"    # Energon reader: the sample index in that shard
PARTS = "__parts__"      # Energon: the sample's parts by extension, before its field map applies
FIELDS = "__fields__"    # Energon: the dataset's field map (field name -> part extension)
ENERGON_SKIP = "__energon_skip__"  # Energon adapter: dropped by SkipSample or a handled error (a Filter counts it)
JOIN = "__join__"        # Energon join: a joined record's member records, primary first (None: no match)

# --- keys of a micro-batch (the tail multiplexer -> hosts) ---
LANE = "__lane__"        # the lane that produced the micro-batch
STEP = "__step__"        # the global step it belongs to
MICRO = "__micro__"      # its index among the lane's micro-batches of that step
PAD = "__pad__"          # how many of its last rows are padding (no data; attention_mask 0); absent: none
ROWS = "__rows__"        # rows in the micro-batch
STATE = "__state__"      # the loader's checkpoint after this micro-batch (when the loader emits states)


class Src(NamedTuple):
    """A source sample's identity: its pointer and its position in the lane's global stream.

    Fields: ``dataset`` (index in the loader's datasets), ``shard`` (index in that dataset), ``sample``
    (index in that shard), ``position`` (global stream position; -1 outside a stream, e.g. a token count)."""

    dataset: int
    shard: int
    sample: int
    position: int


class PieceRef(NamedTuple):
    """One member of a combined row (a pack): the stream ``position`` of its document and the ``piece``."""

    position: int
    piece: int


def src_of(record: dict) -> Src:
    """A single-sample record's ``Src`` (also from a plain 4-tuple, as a user ``Map`` may rebuild it).

    Raises ``TypeError`` for a combined row (a list of ``PieceRef``)."""
    src = record[SRC]
    if type(src) is Src:
        return src
    if isinstance(src, list):
        raise TypeError(f"a combined row has no single source ({len(src)} members); use first_piece")
    return Src(*src)


def piece_ref(record: dict) -> PieceRef:
    """The identity of a single-sample record: its stream position and piece number.

    Raises ``TypeError`` for a combined row (its ``__src__`` is a list; use ``first_piece``)."""
    src = record[SRC]
    if isinstance(src, list):
        raise TypeError(f"a combined row has no single source ({len(src)} members); use first_piece")
    return PieceRef(int(src[3]), int(record.get(PIECE, 0)))


def first_piece(record: dict) -> PieceRef:
    """The identity of a record's first source piece: itself, or a combined row's first member.

    Returns ``PieceRef(-1, 0)`` for a row with no members (a padding row)."""
    src = record[SRC]
    if isinstance(src, list):
        return PieceRef(*(int(x) for x in src[0])) if src else PieceRef(-1, 0)
    return piece_ref(record)


class FieldError(ValueError):
    """A record has no field of that name, or the field is not text (``ops`` re-raises it as ``RecordError``, which
    adds the sample's identity)."""


def field_value(record: dict, name: str):
    """Field ``name`` of a record: a top-level column (MDS, JSONL, Parquet), else an Energon ``field_map`` field
    (``__fields__``), else an Energon tar part (``__parts__``).

    record: a reader's record. name: the field.
    Raises ``FieldError`` naming what the record holds (columns, field_map fields, parts) when none has it.
    """
    if name in record:
        return record[name]
    for inner in (FIELDS, PARTS):
        sub = record.get(inner)
        if isinstance(sub, dict) and name in sub:
            return sub[name]
    msg = f"missing field {name!r} (fields present: {sorted(k for k in record if not k.startswith('__'))}"
    for inner, what in ((FIELDS, "field_map fields"), (PARTS, "parts")):
        if isinstance(record.get(inner), dict):
            msg += f"; {what}: {sorted(record[inner])}"
    raise FieldError(msg + ")")


def field_text(record: dict, name: str) -> str:
    """Field ``name`` of ``record`` as text (``Decode``'s rule, also ``zephon inspect --deep``'s check).

    record: a reader's record. name: a column, Energon field_map field or part (``field_value``).
    Returns the str (bytes decoded as UTF-8). Raises ``FieldError`` when the field is missing, not text
    (None included), or not valid UTF-8."""
    v = field_value(record, name)
    if isinstance(v, bytes):
        try:
            return v.decode("utf-8")
        except UnicodeDecodeError as e:
            raise FieldError(f"field {name!r} is not valid UTF-8: {e}") from None
    if not isinstance(v, str):
        raise FieldError(f"field {name!r} is {type(v).__name__}, expected text")
    return v
