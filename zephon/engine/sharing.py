"""More ranks than lanes: each of the ``shares`` ranks of a lane runs the whole lane and keeps its block.

With ``dp_degree = shares * canonical_replicas``, the ``shares`` ranks of a lane each run that lane's full
pipeline (the cost: every sharing rank does the lane's whole work) and keep block ``index`` of the
``shares`` contiguous, equal blocks of each step's rows (whole micro-batches); the other blocks are
produced and discarded. The lane's output does not depend on the rank, so the union of the blocks over
the sharing ranks, in rank order, is the lane's step: the global batch stays byte-identical to any other
dp_degree. A lane's checkpoint entry is one cursor, so a sharing rank hands out its last micro-batch of a
step only once the whole step is taken (the blocks after its own drained): its ``__state__`` and
``Loader.checkpoint()`` then say "through step s", the same entry on every rank that shares the lane
(``checkpoint.merge_states`` accepts a lane from several ranks only when identical). See
docs/distributed.md, "More ranks than lanes".
"""
from __future__ import annotations

from ..formats.records import LANE, MICRO, STATE, STEP


def shared_micro_batches(loader, steps):
    """Filter a sharing rank's lane micro-batches down to its block of each step.

    Args:
        loader: the ``Loader`` (``lane_shares`` > 1, ``share_index``, ``rows_per_lane_step``,
            ``batch.micro_batch_size``; it owns one lane, or none as a host worker without a share).
        steps: the loader's own iterator over its lane's ``(micro-batch, Handed)`` (``Tail.steps``), in (step,
            micro-batch) order; micro-batch ``j`` of a step holds the lane's rows ``[j*m, (j+1)*m)`` of it.
    Yields ``(micro-batch, Handed or None)`` (None: delivered here already): the micro-batches ``j`` with
    ``index*b <= j < (index+1)*b`` (``b = rows_per_lane_step / (shares * micro_batch_size)``), ``__micro__``
    unchanged (the lane's index, so every rank's micro-batches of a lane sort into the lane's order). Before the
    last of them in a step, the rest of the step is taken and the lane read one row ahead, so its ``__state__``
    (with ``emit_state``) is the deterministic step-boundary entry."""
    per_step = loader.rows_per_lane_step // loader.batch.micro_batch_size  # micro-batches of a lane's step
    lo, hi = own_block(loader)
    held = None  # this rank's last micro-batch of the step, waiting for the rest of the step to be taken
    for mb, handed in steps:
        j = mb[MICRO]
        if held is not None and (mb[STEP] != held[STEP]):
            yield _settled(loader, held)  # the step ended early (a finite lane's short tail)
            held = None
        if lo <= j < hi and j != hi - 1:
            yield mb, handed  # delivered by the consumer before the tail builds the lane's next micro-batch
            continue
        # This rank's last micro-batch of the step, and the other ranks' blocks, count as delivered now, in the
        # lane's order (the tail reads the lane's next rows from the cursor after them).
        loader.tail.deliver(mb, handed)
        if j == hi - 1:
            held = mb
        if held is not None and j == per_step - 1:
            yield _settled(loader, held)
            held = None
    if held is not None:
        yield _settled(loader, held)


def own_block(loader) -> tuple[int, int]:
    """``(lo, hi)``: the micro-batches ``lo <= j < hi`` of each lane step that this rank keeps (all of them when
    it shares no lane). loader: the ``Loader``."""
    per_step = loader.rows_per_lane_step // loader.batch.micro_batch_size
    b = per_step // loader.lane_shares
    return loader.share_index * b, (loader.share_index + 1) * b


def _settled(loader, mb: dict) -> tuple[dict, None]:
    """``(mb, None)``, delivered already, with its lane's state read once the lane holds its next row (or
    ended): a span whose rows were all taken is then sealed on every rank alike, whatever its prefetch, so the
    entry is the same."""
    lane = mb[LANE]
    loader.lane(lane).drop()  # the step's rows, all delivered: ``ensure`` counts the rows after them
    loader.ensure(lane, 1)
    if loader.emit_state:
        mb[STATE] = loader.lane(lane).state()
    return mb, None


def own_rows(loader, lane_rows: int) -> int:
    """How many of a shared lane's first ``lane_rows`` rows fall in this rank's block of their steps.

    loader: the ``Loader`` (``lane_shares`` > 1). lane_rows: rows of the lane in delivery order (an int >= 0).
    Closed form: every whole step gives ``rows_per_rank_step`` rows; the step in progress gives the part of
    ``[share_index * b, (share_index + 1) * b)`` (``b = rows_per_rank_step``) it has reached. Summed over the
    sharing ranks this is ``lane_rows``.
    """
    rps, b = loader.rows_per_lane_step, loader.rows_per_rank_step
    steps, within = divmod(lane_rows, rps)
    return steps * b + min(max(within - loader.share_index * b, 0), b)


def shared_stats(loader, lane_rows: int, padded: int, dropped: int) -> dict:
    """``delivered_rows``, ``padded_rows``, ``dropped_rows`` of this rank's block (``Loader.stats`` with shared lanes).

    loader: the ``Loader``. lane_rows: its lane's cursor (rows consumed: delivered, then the padding of a
    finite pass's last step or the rows dropped after it). padded, dropped: the lane's padding and dropped
    rows. A lane's rows are real rows first, then padding (drop_last=False) or dropped rows (drop_last=True),
    so each kind's share is the blocks' overlap with its stretch of the lane.
    """
    real = lane_rows - padded - dropped
    return {"delivered_rows": own_rows(loader, real),
            "padded_rows": own_rows(loader, real + padded) - own_rows(loader, real),
            "dropped_rows": own_rows(loader, lane_rows) - own_rows(loader, real + padded)}
