"""The TaskEncoder's packing (``select_samples_to_pack`` / ``pack_selected_samples``) as a per-lane accumulator.

Runs on the pump, one accumulator per lane, in order, with Energon's packing-buffer semantics; a flush
sentinel packs what the buffer holds, as Energon does at the end of its stream.
"""
from __future__ import annotations

from zephon.ops import Accumulator, Operator, RecordError

from ._hooks import call_hook, element_index, energon_context, expand_result, fn_name, overridden
from zephon.formats.records import PIECE, SRC, PieceRef, first_piece


class TaskPack(Operator):
    """Accumulator operator: the task encoder's packing with a buffer of ``buffer_size`` samples.

    As Energon's ``PackingDataset``: the reading buffer fills until reading + selected samples reach
    ``buffer_size``; then, if no selected packs remain, ``select_samples_to_pack(reading buffer)`` picks
    the packs (samples it leaves out are dropped); one pack is finished per arriving sample
    (``postencode_sample`` on each member, then ``pack_selected_samples``, possibly a generator). A
    flush (sentinel or end of lane) finishes every selected pack, selects from what is left and
    finishes those too. Decisions depend only on the lane's elements since the last flush."""

    name = "energon_pack"

    def __init__(self, task_encoder, buffer_size: int, *, seed_offset: int, error_handler=None):
        if not isinstance(buffer_size, int) or buffer_size < 1:
            raise ValueError(f"packing_buffer_size must be an int >= 1, got {buffer_size!r}")
        if not all(overridden(task_encoder, h) for h in ("select_samples_to_pack", "pack_selected_samples")):
            raise ValueError("packing_buffer_size needs a TaskEncoder that overrides both select_samples_to_pack "
                             "and pack_selected_samples (as Energon requires)")
        self.te, self.buffer_size = task_encoder, buffer_size
        self.seed_offset, self.error_handler = seed_offset, error_handler
        self.postencode = task_encoder.postencode_sample if overridden(task_encoder, "postencode_sample") else None

    def fingerprint(self) -> dict:
        return {"op": self.name, "buffer_size": self.buffer_size,
                "select": fn_name(self.te.select_samples_to_pack), "pack": fn_name(self.te.pack_selected_samples),
                "postencode": fn_name(self.postencode) if self.postencode else None}

    def new_accumulator(self, lane: int) -> "TaskPackAccumulator":
        return TaskPackAccumulator(self)


class TaskPackAccumulator(Accumulator):
    def __init__(self, op: TaskPack):
        self.op = op
        self.reading: list[dict] = []
        self.packs: list[list[dict]] = []
        self.selected = 0

    def push(self, record: dict) -> list[dict]:
        self.reading.append(record)
        out = []
        while len(self.reading) + self.selected >= self.op.buffer_size:
            if not self.packs:
                self._select()
                if not self.packs:
                    break  # nothing selected: the buffer was dropped, refill
            out.extend(self._finish())
        return out

    def flush(self) -> list[dict]:
        out = []
        while self.packs:
            out.extend(self._finish())
        if self.reading:
            self._select()
        while self.packs:
            out.extend(self._finish())
        self.reading, self.packs, self.selected = [], [], 0
        return out

    def _select(self) -> None:
        recs, self.reading = self.reading, []
        by_id = {id(r["sample"]): r for r in recs}
        with energon_context(self.op.seed_offset, element_index(recs[0])):
            groups = call_hook(self.op.te.select_samples_to_pack, [r["sample"] for r in recs], recs[0],
                           self.op.error_handler, "select_samples_to_pack") or []
        for g in groups:
            if len(g) == 0:
                continue
            try:
                members = [by_id[id(s)] for s in g]
            except KeyError:
                raise RecordError("select_samples_to_pack returned a sample that was not in the buffer "
                                  "(return the given sample objects, grouped)", recs[0]) from None
            self.packs.append(members)
            self.selected += len(members)

    def _finish(self) -> list[dict]:
        members = self.packs.pop(0)
        self.selected -= len(members)
        op = self.op
        with energon_context(op.seed_offset, element_index(members[0])):
            samples = [m["sample"] for m in members]
            if op.postencode is not None:
                samples = [call_hook(op.postencode, s, m, op.error_handler, "postencode_sample")
                           for s, m in zip(samples, members)]
                samples = [s for s in samples if s is not None]
                if not samples:
                    return []
            packed = call_hook(op.te.pack_selected_samples, samples, members[0], op.error_handler,
                           "pack_selected_samples")
            packed = expand_result(packed, members[0], op.error_handler, "pack_selected_samples")
        src = [PieceRef(first_piece(m).position, m.get(PIECE, 0)) for m in members]
        return [{"sample": p, SRC: list(src), **({PIECE: k} if k else {})} for k, p in enumerate(packed)]
