"""Concatenation packing (``Pack(method="concat")``): a lane's documents end to end, cut into fixed windows.

As Megatron-LM's GPT dataset, TorchTitan and llm-foundry's ``concat_tokens`` build pretraining rows: no padding,
documents split across rows. Each document ends with the end-of-document token ``Tokenize`` appends
(``add_eos``, its default). What is left after the last full window (fewer tokens than a window) stays for the
next row, across flush sentinels too: the lane's checkpoint names those documents by identity, the first one
with the token offset it resumes at (``[position, piece, offset]``), never by their tokens. Only the end of a
finite lane emits a partly filled row. See docs/concepts.md (packing).
"""
from __future__ import annotations

from collections import deque
from itertools import accumulate

import numpy as np

from .base import Accumulator, RecordError
from ..formats.records import DOC_OFFSETS, OFFSET, SRC, piece_ref



class ConcatAccumulator(Accumulator):
    """One lane's concatenation: ``docs`` holds ``[record, offset]`` (tokens of it not yet in a row start at
    ``offset``), ``pending`` their token count. A row is cut once ``pending`` reaches a window (``max_length``
    tokens, or ``max_length + 1`` with ``shift_labels``, the last of which starts the next row as well)."""

    def __init__(self, op):
        self.op = op
        self.cap = op.max_length
        self.window = op.max_length + (1 if op.shift_labels else 0)
        self._positions = np.arange(op.max_length, dtype=np.int32)
        self.mark_offsets = False  # explain sets it: rows then say where each piece starts in its document
        self._reset()

    def _reset(self):
        self.docs: deque = deque()
        self.pending = 0

    def push(self, record: dict) -> list[dict]:
        if "input_ids" not in record:
            raise RecordError("pack needs tokenized records (input_ids): put Tokenize before Pack", record)
        n = record["input_ids"].size
        if not n:  # an empty document (no text, no EOS) has no token to deliver
            return []
        self.docs.append([record, 0])
        self.pending += n
        out = []
        while self.pending >= self.window:
            out.append(self._cut(self.window))
        return out

    def flush(self) -> list[dict]:
        """The end of the lane: what is left (fewer tokens than a window) as one padded row, if anything."""
        out = [self._cut(self.pending)] if self.pending else []
        self._reset()
        return out

    def flush_empty(self) -> dict:
        """A row holding no document (all padding): the shape of every row this operator emits."""
        return self._row([], 0)

    def carry(self) -> tuple[list[dict], list[list[dict]]]:
        """At a flush sentinel: emit nothing and keep the remainder; return ``([], [records])``, the records with
        tokens left (the first one with ``OFFSET`` set when a row already took its head)."""
        held = [{**r, OFFSET: off} if off else r for r, off in self.docs]
        return [], [held] if held else []

    def resume(self, bins: list[list[dict]]) -> None:
        """Hold the records of ``bins`` (as ``carry`` returned them, regenerated) again, from their ``OFFSET``."""
        self._reset()
        for docs in bins:
            for r in docs:
                self.docs.append([r, r.get(OFFSET, 0)])
                self.pending += r["input_ids"].size - r.get(OFFSET, 0)

    def _cut(self, size: int) -> dict:
        """One row from the first ``size`` pending tokens. Without ``shift_labels`` it consumes them all; with it,
        the inputs are the first ``max_length`` of them and the labels the next token of each, so the row consumes
        ``min(size, max_length)`` tokens and the last one of a full window starts the next row too."""
        take = min(size, self.cap)
        segments, left, k = [], size, 0  # (record, start, tokens in this row's window)
        while left:
            record, off = self.docs[k]
            n = min(record["input_ids"].size - off, left)
            segments.append((record, off, n))
            left -= n
            k += 1
        row = self._row(segments, take)
        self.pending -= take
        while take:  # advance the head past the consumed tokens
            record, off = self.docs[0]
            n = record["input_ids"].size - off
            if n > take:
                self.docs[0][1] = off + take
                break
            self.docs.popleft()
            take -= n
        return row

    def _row(self, segments: list, take: int) -> dict:
        """The row of ``segments`` (``(record, start, n)``, the window's tokens in order), ``take`` of them inputs,
        padded to ``max_length``."""
        cap, op = self.cap, self.op
        parts = [r["input_ids"][s:s + n] for r, s, n in segments]
        tokens = (np.concatenate(parts) if len(parts) > 1 else parts[0]) if parts else np.zeros(0, dtype=np.int32)
        # where each segment starts in the window (Python ints: numpy's cumsum of a short list costs more than the
        # row), and whether that is a document's (a record's) first token
        starts = list(accumulate([n for _, _, n in segments[:-1]], initial=0)) if segments else []
        doc_start = np.zeros(tokens.size + 1, dtype=bool)
        doc_start[[st for st, (_, s, _) in zip(starts, segments) if s == 0]] = True
        ids = np.full(cap, op.pad_id, dtype=np.int32)
        ids[:take] = tokens[:take]
        labels = np.full(cap, op.label_pad, dtype=np.int32)
        if op.shift_labels:  # label t is token t + 1 (none past the window), masked where a document starts
            nxt = tokens[1:take + 1]
            labels[:nxt.size] = np.where(doc_start[1:nxt.size + 1], op.label_pad, nxt)
        else:  # the model shifts; a document's first token is never a target
            labels[:take] = np.where(doc_start[:take], op.label_pad, tokens[:take])
        # the inputs' segments: cu_seqlens and positions restart at each document and at the row's start
        members = [(r, s, n) for (r, s, n), st in zip(segments, starts) if st < take]
        lens = [min(n, take - st) for (_, _, n), st in zip(members, starts)]
        cu = np.array([0, *accumulate(lens)], dtype=np.int32)
        pos = np.zeros(cap, dtype=np.int32)
        if take:
            pos[:take] = self._positions[:take] - np.repeat(cu[:-1], lens)
        mask = np.zeros(cap, dtype=np.uint8)
        mask[:take] = 1
        row = {"input_ids": ids, "labels": labels, "position_ids": pos, "attention_mask": mask,
               "cu_seqlens": cu, "num_tokens": take, SRC: [piece_ref(r) for r, _, _ in members]}
        if self.mark_offsets:  # never in a loader's rows: the stream's fields stay as they are
            row[DOC_OFFSETS] = [s for _, s, _ in members]
        return row
