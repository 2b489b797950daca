"""What the size split of a packed finite pass needs from the pipeline: each sample's tokens.

``work.balance`` cuts a finite pass's end over the lanes by bytes known before reading; for packed rows it plans
whole rows per lane, which takes tokens, not bytes. ``row_split(stage, ops)`` gives the ``WorkSource(rows=...)``
argument: the packer's row length and ``StageTokens``, which runs a few sampled pointers through the worker
stage (decode, tokenize) so ``balance`` can fit tokens against bytes. See docs/concepts.md ("finite passes").
"""
from __future__ import annotations

import numpy as np

from ..formats.records import src_of


class StageTokens:
    """``tokens_of(pointers)`` for ``WorkSource(rows=...)``: each pointer's tokens out of the worker stage.

    Args:
        stage: the plan's ``WorkStage`` (datasets and the stateless operators before the first accumulator).
    Calling it with a ``work.ChunkPointers`` returns one float per pointer: the ``input_ids`` length summed over
    the records of that sample (0 for a sample filtered or skipped). Raises the stage's ``DataError`` (naming
    file, shard and sample) for bad input that is not skipped. Picklable (host workers get the plan)."""

    def __init__(self, stage):
        self.stage = stage

    def __call__(self, ptrs) -> np.ndarray:
        res = self.stage.run(ptrs)
        if res.error is not None:
            raise res.error
        by_position: dict[int, int] = {}
        for rec in res.records:
            ids = rec.get("input_ids")
            if ids is not None:
                p = src_of(rec).position
                by_position[p] = by_position.get(p, 0) + len(ids)
        return np.array([by_position.get(p, 0) for p in ptrs.positions.tolist()], dtype=np.float64)


def row_split(stage, ops):
    """``(tokens per row, StageTokens(stage))`` when ``ops`` pack rows (``Pack``) from tokens the worker stage
    makes (a ``Tokenize`` among its operators), else None (the split stays by bytes)."""
    pack = next((op for op in ops if op.name == "pack"), None)
    if pack is None or not any(op.name == "tokenize" for op in stage.ops):
        return None
    return pack.max_length, StageTokens(stage)
