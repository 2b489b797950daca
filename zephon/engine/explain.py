"""Explain global steps: which source documents every row of a global batch holds, from the config alone.

A lane's rows are a pure function of its pointers, regenerated from ``(lane, chunk)``: a step is explained by
replaying each lane from the flush span that holds the step's rows (when rows are pointers, one row per sample)
or from a checkpoint's cursors (a packed or filtered pipeline, whose row count per span depends on the data),
never by running the loader to the step. See docs/debugging.md.
"""
from __future__ import annotations

import numpy as np

from ..checkpoint import LaneCursor
from ..checkpoint.skips import covers, stream_row
from ..formats.records import PIECE, SRC, PieceRef, Src
from ..ops.pack_concat import DOC_OFFSETS
from .lane import LanePipeline
from .metrics import mark_offsets
from .plan import dataset_names
from .runners import make_runner

#: Operators whose output has one record per input record (besides the reordering ones).
ONE_TO_ONE = ("decode", "map")


def rows_are_pointers(plan) -> bool:
    """Whether every lane row is one sample pointer (no packing, filter, split or skipped sample), so the span
    holding a lane's row ``k`` is known without reading: ``k // flush_span``."""
    if any(getattr(d, "on_error", "raise") != "raise" for d in plan.datasets):
        return False
    for op in plan.ops:
        if op.reorders_only or op.name in ONE_TO_ONE:
            continue
        if op.name == "tokenize" and op.max_length is None:
            continue
        return False
    return True


def explain(plan, steps, *, state=None, text_field: str | None = None) -> dict:
    """Every row of the global batches of ``steps``: lane, micro-batch, and each source piece it holds.

    plan: the run's ``LoaderPlan`` (any dp: the global batch is the same). steps: a global step (int) or a range
        of them, numbered as training sees them (after the checkpoint's skipped ranges).
    state: a checkpoint of the run (merged, any dp) at or before the first step: lanes replay from its cursors
        (needed for a packed or filtered pipeline far into a run; without it such lanes replay from step 0).
        Its skipped ranges apply (or ``plan``'s, when they extend them: a loader restored from it with more).
    text_field: also return each piece's document text from this field (``Decode``'s), read again from the file.
    Returns ``{"steps", "skips", "rows_per_lane_step", "micro_batch_size", "replayed_pointers", "rows"}``; each
    row ``{"step", "stream_step", "lane", "rank", "micro", "row", "pad", "pieces"}`` (``stream_step``: the step of
    the uninterrupted stream it comes from; ``rank``: the dp rank of ``plan`` that delivers it; ``pad``: a
    padding row of a finite pass's end), each piece ``{"dataset", "dataset_name", "shard", "file", "sample",
    "position", "piece", "tokens"}`` plus what the format knows (``line``, ``bytes``), ``text``, and for
    ``Pack(method="concat")`` rows ``document_tokens`` (the piece's ``[start, stop)`` in its document's tokens).
    Raises ``CheckpointError`` for a state of another config, ``ValueError`` for a negative step."""
    steps = range(steps, steps + 1) if isinstance(steps, int) else range(steps.start, steps.stop)
    if not steps or steps.start < 0:
        raise ValueError(f"explain needs steps >= 0, got {steps}")
    lanes = list(range(plan.canonical_replicas))
    cursors = {}
    if state is not None:
        restored = plan.with_restored_skips(state)
        if not covers(plan.skips, restored.skips):  # not a loader resumed from it with more skips
            plan = restored
        cursors = plan.validate(state, lanes)
    skips = plan.skips
    rps, m = plan.rows_per_lane_step, plan.micro_batch_size
    runner = make_runner("inline", plan.stage)
    owner = _row_owners(plan)
    rows, replayed = [], 0
    for lane in lanes:
        wanted = {stream_row(s * rps + i, rps, skips): (s, i) for s in steps for i in range(rps)}
        got, n = _lane_rows(plan, runner, lane, cursors.get(lane), sorted(wanted))
        replayed = max(replayed, n)
        for o, (s, i) in sorted(wanted.items(), key=lambda kv: kv[1]):
            row = got.get(o)
            rows.append({"step": s, "stream_step": o // rps, "lane": lane, "rank": owner(lane, i), "micro": i // m,
                         "row": i % m, "pad": row is None and plan.finite,
                         "pieces": [] if row is None else _pieces(plan, lane, row, text_field)})
    rows.sort(key=lambda r: (r["step"], r["lane"], r["micro"], r["row"]))
    return {"steps": [steps.start, steps.stop], "skips": [list(s) for s in skips], "rows_per_lane_step": rps,
            "micro_batch_size": m, "replayed_pointers": replayed, "rows": rows}


def _row_owners(plan):
    """``owner(lane, row of the lane's step) -> dp rank`` under ``plan``'s dp_degree and lane assignment."""
    by_lane = {}
    for r in range(plan.dp_degree):
        p = plan.for_rank(plan.dp_degree, r)
        for lane in p.rank_lanes:
            by_lane.setdefault(lane, []).append((p.share_index, r))
    rows = plan.rows_per_lane_step

    def owner(lane: int, i: int) -> int:
        shares = sorted(by_lane[lane])
        return shares[i * len(shares) // rows][1]
    return owner


def _start(plan, lane: int, cursor: LaneCursor | None, first: int) -> tuple[LaneCursor, int]:
    """The cursor a replay of ``lane`` starts from to reach its stream row ``first``, and the stream row index of
    the first row it yields: the span holding ``first`` when rows are pointers, else the checkpoint's cursor when
    it is not past ``first``, else the lane's start."""
    span, chunk = plan.flush_span, plan.source.chunk_size
    if rows_are_pointers(plan):
        return LaneCursor.at_span(lane, first // span, first % span, first, span=span, chunk_size=chunk), first
    if cursor is not None and cursor.stream_rows <= first:
        return cursor, cursor.stream_rows
    return LaneCursor.fresh(lane), 0


def _lane_rows(plan, runner, lane: int, cursor, wanted: list) -> tuple[dict, int]:
    """``({stream row index: row}, pointers read)`` for the sorted stream row indexes ``wanted`` of ``lane``
    (those past a finite lane's end are absent)."""
    start, index = _start(plan, lane, cursor, wanted[0])
    st = LanePipeline(lane, plan.source, plan.chain_ops, plan.datasets, span=plan.flush_span,
                      unit_size=plan.unit_size, start=start)
    mark_offsets(st.chain)  # where each piece starts in its document (its rows go nowhere else)
    first = start.first_pointer(plan.source.chunk_size)
    want, out = set(wanted), {}
    while index <= wanted[-1]:
        while st.rows and index <= wanted[-1]:
            _, row, *_ = st.rows.popleft()
            if index in want:
                out[index] = row
            index += 1
        if index > wanted[-1] or st.finished:
            break
        if st.can_dispatch():
            st.dispatch(runner)
        st.release(block=True)
    pointers = st.next_chunk * plan.source.chunk_size + (st.cur_offset if st.cur is not None else 0) - first
    return out, pointers


def _pieces(plan, lane: int, row: dict, text_field: str | None) -> list[dict]:
    """The source pieces of one lane row: its own sample, or a packed row's documents with their token spans."""
    src = row[SRC]
    if isinstance(src, list):  # a packed row: (position, piece) per document, tokens by cu_seqlens
        refs = [PieceRef(*(int(x) for x in r)) for r in src]
        cu = [int(x) for x in row["cu_seqlens"]] if "cu_seqlens" in row else [0] * (len(refs) + 1)
        spans = [[cu[k], cu[k + 1]] for k in range(len(refs))]
    else:
        s = Src(*(int(x) for x in src))
        refs, spans = [PieceRef(s.position, int(row.get(PIECE, 0)))], [None]
        if "num_tokens" in row:
            spans = [[0, int(row["num_tokens"])]]
    ptrs = plan.source.pointers(lane, -1, np.array([r.position for r in refs], dtype=np.int64))
    out, names = [], dataset_names(plan.datasets)
    for k, ref in enumerate(refs):
        d, shard, sample = int(ptrs.dataset_ids[k]), int(ptrs.shard_ids[k]), int(ptrs.sample_idx[k])
        ds = plan.datasets[d]
        piece = {"dataset": d, "dataset_name": names[d], "shard": shard, "file": ds.shards[shard].path,
                 "sample": sample, "position": ref.position, "piece": ref.piece, "tokens": spans[k]}
        if DOC_OFFSETS in row:  # concat packing: the piece's tokens in its document (after a row cut it)
            start = int(row[DOC_OFFSETS][k])
            piece["document_tokens"] = [start, start + spans[k][1] - spans[k][0]]
        piece.update(ds.locate(shard, sample))
        if text_field is not None:
            piece["text"] = str(ds.read(shard, [sample])[0].get(text_field, ""))
        out.append(piece)
    return out
