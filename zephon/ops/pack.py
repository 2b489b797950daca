"""Packing tokenized documents into fixed-length rows (a per-lane accumulator).

Documents (``input_ids`` of at most ``max_length`` tokens; split longer ones with
``Tokenize(max_length=...)``) go into open bins of capacity ``max_length``. ``best_fit`` puts a document
in the open bin with the least room that still fits it, ``first_fit`` in the oldest bin that fits.
A bin is emitted when exactly full, or, when more than ``max_open_bins`` are open, the fullest one is
emitted (oldest on ties).

At a flush sentinel the open bins are carried into the next span instead of being padded out: the
fullest are emitted until at most ``max_carry`` documents stay open, and the rest are named in the lane's
checkpoint by identity (``(position, piece)``, a few dozen integers), so a resume re-reads them. At the
end of a lane (or a flush with nothing to carry into) the open bins' documents are re-packed, longest
first, into as few rows as first fit finds, so a finite pass ends on about one partly filled row.
``concat`` concatenates the documents and cuts windows instead (``ops.pack_concat``: no padding, documents
split across rows). See docs/concepts.md (packing).
"""
from __future__ import annotations

from bisect import bisect_left, insort
from itertools import accumulate

import numpy as np

from .base import Accumulator, Operator, RecordError
from .pack_concat import ConcatAccumulator
from ..formats.records import SRC, piece_ref

PACK_METHODS = ("best_fit", "first_fit")  # the bin packers (pinned together by tests/test_golden.py)
METHODS = PACK_METHODS + ("concat",)


class Pack(Operator):
    """Accumulator operator: tokenized documents -> packed rows.

    Args:
        max_length: tokens per row (default 2048).
        method: ``"best_fit"``, ``"first_fit"`` or ``"concat"`` (documents end to end, cut into windows of
            ``max_length`` tokens: no padding but at a finite lane's end, documents split across rows, the
            remainder carried to the next row and across flush sentinels; ``ops.pack_concat``).
        max_open_bins: bins kept open before the fullest is emitted (memory and padding trade-off; not concat).
        max_carry: documents of open bins carried across a flush sentinel (each costs one integer, or
            two for a piece of a split document, in every lane's checkpoint); 0 pads every bin out there.
            Not concat, which carries its whole remainder (fewer than ``max_length`` tokens, so at most that
            many documents).
        shift_labels: concat only: windows of ``max_length + 1`` tokens as Megatron-LM builds them (each
            window's last token starts the next one); ``input_ids`` are the first ``max_length``, ``labels`` the
            next token of each (already shifted: the model must not shift again).
        pad_id: token id for padding; ``label_pad``: label at padding and at each document's first token
            (so no position learns to predict across a document boundary).
    Output rows (numpy arrays of length ``max_length``): ``input_ids`` int32, ``labels`` int32 (equal to
    ``input_ids`` where trained; the model shifts), ``position_ids`` int32 (restart at 0 per document),
    ``attention_mask`` uint8 (1 = token, 0 = padding); ``cu_seqlens`` int32[docs + 1] (document
    boundaries, flash-attention style); ``num_tokens``; ``__src__`` list of ``(position, piece)``.
    With concat, ``cu_seqlens`` and ``position_ids`` also restart at the row's start (a document continued
    from the row before) and ``__src__`` names every document with tokens in the row.
    Raises ``RecordError`` for a document longer than ``max_length`` (bin packers only)."""

    name = "pack"

    def __init__(self, max_length: int = 2048, method: str = "best_fit", max_open_bins: int = 32,
                 pad_id: int = 0, label_pad: int = -100, max_carry: int = 64, shift_labels: bool = False):
        if method not in METHODS:
            raise ValueError(f"pack method must be one of {METHODS}, got {method!r}")
        if shift_labels and method != "concat":
            raise ValueError(f"shift_labels=True needs method='concat' (got {method!r}): bin packers emit labels "
                             f"equal to input_ids and the model shifts")
        if max_length < 1 or max_open_bins < 1:
            raise ValueError("max_length and max_open_bins must be >= 1")
        if not isinstance(max_carry, int) or max_carry < 0:
            raise ValueError(f"max_carry must be an int >= 0, got {max_carry!r}")
        if pad_id < 0:
            raise ValueError(f"pad_id must be a token id >= 0, got {pad_id}")
        self.max_length, self.method, self.max_open_bins = max_length, method, max_open_bins
        self.pad_id, self.label_pad, self.max_carry = pad_id, label_pad, max_carry
        self.shift_labels = bool(shift_labels)

    def fingerprint(self) -> dict:
        fp = {"op": self.name, "max_length": self.max_length, "method": self.method,
              "max_open_bins": self.max_open_bins, "pad_id": self.pad_id, "label_pad": self.label_pad,
              "max_carry": self.max_carry}
        if self.method == "concat":  # the bin packers' fingerprints (and so their checkpoints) stay as they were
            fp["shift_labels"] = self.shift_labels
        return fp

    def max_carried(self) -> int:
        """The most documents one lane may carry across a flush sentinel (what its checkpoint entry names)."""
        return self.max_length if self.method == "concat" else self.max_carry

    def new_accumulator(self, lane: int):
        return ConcatAccumulator(self) if self.method == "concat" else PackAccumulator(self)


class PackAccumulator(Accumulator):
    def __init__(self, op: Pack):
        self.op = op
        self.cap = op.max_length
        self._positions = np.arange(op.max_length, dtype=np.int32)
        self._reset()

    def _reset(self):
        self.bins: dict[int, list] = {}   # bin id -> list of documents
        self.room: dict[int, int] = {}    # bin id -> free tokens
        self.by_room: list[tuple[int, int]] = []  # sorted (free tokens, bin id), for best fit
        self.next_id = 0

    def push(self, record: dict) -> list[dict]:
        if "input_ids" not in record:
            raise RecordError("pack needs tokenized records (input_ids): put Tokenize before Pack", record)
        n = record["input_ids"].size
        if n > self.cap:
            raise RecordError(f"document of {n} tokens exceeds pack max_length={self.cap}; "
                              f"tokenize with max_length={self.cap} to split it", record)
        bid = self._find(n)
        if bid is None:
            bid = self.next_id
            self.next_id += 1
            self.bins[bid] = []
            self.room[bid] = self.cap
        else:
            self.by_room.remove((self.room[bid], bid))
        self.bins[bid].append(record)
        self.room[bid] -= n
        if self.room[bid] == 0:
            return [self._emit(bid)]
        insort(self.by_room, (self.room[bid], bid))
        if len(self.bins) > self.op.max_open_bins:
            fullest = self.by_room.pop(0)[1]
            return [self._emit(fullest)]
        return []

    def _find(self, n: int):
        if self.op.method == "best_fit":
            i = bisect_left(self.by_room, (n, -1))
            return self.by_room[i][1] if i < len(self.by_room) else None
        for bid in self.bins:  # dicts keep insertion order: oldest first
            if self.room[bid] >= n:
                return bid
        return None

    def flush(self) -> list[dict]:
        """Re-pack the open bins' documents, longest first (ties in their order), first fit into new bins,
        and emit every one: about one partly filled row instead of one per open bin."""
        docs = [d for bid in self.bins for d in self.bins[bid]]
        self._reset()
        docs.sort(key=lambda d: -d["input_ids"].size)  # stable: equal lengths keep their order
        fill: list[int] = []
        packed: list[list] = []
        for d in docs:
            n = d["input_ids"].size
            k = next((i for i, used in enumerate(fill) if used + n <= self.cap), len(fill))
            if k == len(fill):
                fill.append(0)
                packed.append([])
            fill[k] += n
            packed[k].append(d)
        return [self._row(group) for group in packed]

    def flush_empty(self) -> dict:
        """A row holding no document (all padding): the shape of every row this operator emits."""
        return self._row([])

    def carry(self) -> tuple[list[dict], list[list[dict]]]:
        """At a flush sentinel: emit the fullest bins (oldest on ties) until at most ``max_carry`` documents
        are open; return ``(rows, bins)``, ``bins`` the open bins' documents, oldest bin first, to be named
        in the checkpoint (``resume`` rebuilds the same state from them)."""
        out = []
        while sum(len(b) for b in self.bins.values()) > self.op.max_carry:
            out.append(self._emit(self.by_room.pop(0)[1]))
        return out, [list(self.bins[bid]) for bid in self.bins]

    def resume(self, bins: list[list[dict]]) -> None:
        """Open ``bins`` (lists of documents, as ``carry`` returned them) in that order, as if carried."""
        self._reset()
        for docs in bins:
            bid = self.next_id
            self.next_id += 1
            self.bins[bid] = list(docs)
            self.room[bid] = self.cap - sum(d["input_ids"].size for d in docs)
            insort(self.by_room, (self.room[bid], bid))

    def _emit(self, bid: int) -> dict:
        self.room.pop(bid)
        return self._row(self.bins.pop(bid))

    def _row(self, docs: list[dict]) -> dict:
        """One packed row of ``docs`` (in order), padded to ``max_length``."""
        cap, op = self.cap, self.op
        arrs = [d["input_ids"] for d in docs]
        lens = [a.size for a in arrs]
        bounds = [0, *accumulate(lens)]  # Python ints: numpy's cumsum of a short list costs more than the row
        used = bounds[-1]
        ids = np.full(cap, op.pad_id, dtype=np.int32)
        if arrs:
            ids[:used] = np.concatenate(arrs) if len(arrs) > 1 else arrs[0]
        labels = ids.copy()
        labels[used:] = op.label_pad
        labels[[b for b, n in zip(bounds, lens) if n]] = op.label_pad  # each document's first token
        cu = np.array(bounds, dtype=np.int32)
        pos = np.zeros(cap, dtype=np.int32)
        if used:  # positions restart at 0 in each document
            pos[:used] = self._positions[:used] - np.repeat(cu[:-1], lens)
        mask = np.zeros(cap, dtype=np.uint8)
        mask[:used] = 1
        return {"input_ids": ids, "labels": labels, "position_ids": pos, "attention_mask": mask,
                "cu_seqlens": cu, "num_tokens": used,
                SRC: [piece_ref(d) for d in docs]}
