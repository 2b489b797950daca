"""End-of-stream agreement: every rank stops at the same step of a finite stream.

A finite pass (``exhaustion="stop"``) with ``drop_last`` ends where the first lane runs out, and lanes
(hence ranks, and a rank's DataLoader workers) run out at different steps. A rank that stopped early
would leave the others hanging in their next collective, and which samples are delivered would depend on
the worker count. So each step is released only when every lane of the rank holds it complete and, under
torch.distributed, every rank says the same (one ``all_reduce(MIN)`` per step on the job's gloo group; a
gloo side group only when the job runs NCCL alone).
Without ``drop_last`` the pass's tail is delivered: each step is voted with ``all_reduce(MAX)`` and goes on
while some rank holds a row of it; a rank (or a lane of it, when the rank's lanes are spread over host
workers) that ran out gets padding micro-batches there (``padded_steps``), so every rank delivers the same
steps. A host whose items are not plain micro-batches (a TaskEncoder's batches) cannot be padded: its ranks
stop together at the first step some rank has no row of, and what the others hold is counted and reported.
With ``Batch(short_last=True)`` the tail carries only real rows (``short_steps``): each step's micro-batch count
is voted with ``all_reduce(MAX)``, and a rank with no row in one of them gets a 0-row micro-batch there, so
every rank runs the same micro-batches of every step (its collectives match) and no rank ends early.
"""
from __future__ import annotations

import itertools
import sys
from dataclasses import replace

from ..checkpoint import LaneCursor, first_step


def _dist():
    """``torch.distributed`` when a process group is up, else None (torch is never imported here)."""
    dist = sys.modules.get("torch.distributed")
    if dist is not None and dist.is_available() and dist.is_initialized():
        return dist
    return None


class StepAgreement:
    """One vote per step across the ranks of a job.

    Args:
        group: the ranks that agree (a torch.distributed group; None: the whole job). Without an
            initialised process group only this process votes.
    ``agree(complete, any_rank=False) -> bool``: True when every rank's ``complete`` is True (with
    ``any_rank``: when some rank's is); ``most(n) -> int``: the largest ``n`` of any rank. A collective under
    torch.distributed: every rank calls it once per step, in the same order. The vote runs on ``group`` when
    it is a gloo group; only without gloo (NCCL) is a gloo side group made, on the first call (itself a
    collective over ``group``'s ranks)."""

    def __init__(self, group=None):
        self.group = group
        self._side = None

    def agree(self, complete: bool, any_rank: bool = False) -> bool:
        dist = _dist()
        if dist is None or dist.get_world_size(self.group) <= 1:
            return complete
        return bool(self._reduce(1 if complete else 0, dist.ReduceOp.MAX if any_rank else dist.ReduceOp.MIN))

    def most(self, n: int) -> int:
        """The largest ``n`` over the ranks (a collective as ``agree``; this rank's alone without one)."""
        dist = _dist()
        if dist is None or dist.get_world_size(self.group) <= 1:
            return n
        return self._reduce(n, dist.ReduceOp.MAX)

    def _reduce(self, n: int, op) -> int:
        import torch

        dist = _dist()
        if self._side is None:
            self._side = _vote_group(dist, self.group)
        flag = torch.tensor([n], dtype=torch.int64)
        dist.all_reduce(flag, op=op, group=self._side)
        return int(flag.item())


def _vote_group(dist, group):
    """The group the per-step vote (a CPU int) runs on: ``group`` itself (None: the default group) when its backend
    moves CPU tensors (gloo, or ``cpu:gloo`` of a mixed backend), so no process group is created for data state.
    Otherwise (NCCL alone) a gloo group over the same ranks: NCCL reduces only device tensors, and a vote on the
    GPU would make the loader pick a device and synchronise it every step."""
    backend = str(dist.get_backend(group))
    if backend == "gloo" or "cpu:gloo" in backend:
        return group
    if group is None:
        return dist.new_group(backend="gloo")
    return dist.new_group(dist.get_process_group_ranks(group), backend="gloo", use_local_synchronization=True)


def agreed_steps(groups, delivered: dict, rows_per_lane_step: int, agreement: StepAgreement, on_drop,
                 whole_steps: bool = True):
    """Release ``groups`` (lists of ``(meta, payload)`` in rank order, ``meta["step"]`` non-decreasing)
    step by step while every rank holds the step: complete in every lane (``whole_steps``, drop_last) or
    with at least one row (short last steps allowed).

    delivered: ``{lane: rows delivered}`` at the start (updated here); rows_per_lane_step: rows per lane per
    step; on_drop(rows): called once with the rows of the first step not released and everything after it
    (what the pass leaves out; 0 when nothing is left), then the stream ends on every rank at the same step."""
    it = itertools.chain(groups, [None])
    group = next(it)
    while True:  # one round per step; the round after the last step tells the other ranks to stop
        step, buffered = (None if group is None else group[0][0]["step"]), []
        while group is not None and group[0][0]["step"] == step:
            buffered.append(group)
            group = next(it)
        for g in buffered:
            for meta, _ in g:
                if meta.get("last", True):  # the lane's entry counts every block of a lane shared by ranks
                    lane = meta["lane"]
                    delivered[lane] = (meta["state"]["delivered_rows"] if "state" in meta
                                       else delivered[lane] + meta["rows"])
        complete = step is not None and (not whole_steps or all(n >= (step + 1) * rows_per_lane_step
                                                                for n in delivered.values()))
        if not agreement.agree(complete):
            rest = itertools.chain(buffered, [group], it)  # `it` ends with the None sentinel
            on_drop(sum(m["rows"] for g in rest if g is not None for m, _ in g if m.get("last", True)))
            return
        yield from buffered


def padded_steps(groups, lanes, cursors, rows_per_lane_step: int, micro_batch_size: int, agreement: StepAgreement,
                 padding, share: tuple[int, int] = (1, 0)):
    """Release ``groups`` (as ``agreed_steps``) step by step while some rank holds a row of the step, filling
    each (step, micro-batch) with a padding item for every lane of ``lanes`` that has none.

    cursors: the rank's ``LaneCursor``s at the start (which (step, micro) each lane owes next);
    padding(lane, step, micro, state) -> ``(meta, payload)``: a micro-batch of padding rows for ``lane``
    whose checkpoint entry becomes ``state`` (the lane's last entry with the padding counted). share: ``(ranks per
    lane, this rank's block)`` when ranks share lanes (``Loader.lane_shares``, ``share_index``): only the block's
    micro-batches are owed, and its last one's entry is the whole step's, as on the lane's other ranks."""
    it = itertools.chain(groups, [None])
    group = next(it)
    state = {c.lane: c for c in cursors}
    per = rows_per_lane_step // micro_batch_size // share[0]
    block = range(share[1] * per, (share[1] + 1) * per)  # the micro-batches of a step this rank delivers
    step = first_step(cursors, rows_per_lane_step)
    while True:
        buffered, group = _take_step(it, group, step)
        if not agreement.agree(bool(buffered), any_rank=True):
            return
        for micro in block:
            out = _padded_micro(buffered.get(micro, ()), lanes, state, (step, micro, micro == block[-1]),
                                rows_per_lane_step, micro_batch_size, padding)
            if out:
                yield out
        step += 1


def short_steps(groups, lanes, cursors, rows_per_lane_step: int, micro_batch_size: int, agreement: StepAgreement,
                empty, share: tuple[int, int] = (1, 0)):
    """Release ``groups`` (as ``agreed_steps``) step by step while some rank holds a row of the step, each step
    with as many micro-batches as the rank with the most has (one ``most`` vote per step); a micro-batch this rank
    owes and holds no row of is one empty item (``Batch(short_last=True)``: only real rows, no padding).

    cursors: the rank's ``LaneCursor``s at the start; empty(lane, step, micro, state) -> ``(meta, payload)``: a
    0-row micro-batch charged to ``lane``, whose checkpoint entry becomes ``state`` (its cursor past the
    micro-batch, so a resume does not deliver it again). share: as ``padded_steps``. Where the job resumes is
    voted too: from the earliest lane of any rank (lanes behind deliver first), with empty items only from the
    furthest one on (a rank whose lanes all ended earlier joins where the others are)."""
    it = itertools.chain(groups, [None])
    group = next(it)
    m, state = micro_batch_size, {c.lane: c for c in cursors}
    micros = rows_per_lane_step // m
    per = micros // share[0]
    block = range(share[1] * per, (share[1] + 1) * per)

    def done(lane):  # micro-batches of the lane's stream delivered (a short one counts whole)
        return -(-state[lane].delivered_rows // m)
    first = -agreement.most(-min((done(lane) for lane in lanes), default=0))
    start = agreement.most(max((done(lane) for lane in lanes), default=0))
    step = first // micros
    while True:
        buffered, group = _take_step(it, group, step)
        count = agreement.most(max((micro - block[0] + 1 for micro in buffered), default=0))
        if not count and (step + 1) * micros > start:
            return
        for micro in block[:count]:
            items = buffered.get(micro, ())
            for meta, _ in items:
                if meta.get("last", True):
                    state[meta["lane"]] = LaneCursor.from_dict(meta["state"])
            at = step * micros + micro
            if items:
                yield items
            elif at >= start and all(done(lane) <= at for lane in lanes):  # owed, and no row: an empty one
                lane = max(lanes, key=done)
                upto = micros if micro == block[-1] else micro + 1
                state[lane] = replace(state[lane], delivered_rows=(step * micros + upto) * m)
                yield [empty(lane, step, micro, state[lane].to_dict())]
        step += 1


def _take_step(it, group, step: int):
    """``({micro: group}, next group)``: the groups of ``step`` read from ``it`` starting at ``group``.
    Raises ``RuntimeError`` for a group of an earlier step (released already)."""
    buffered = {}
    if group is not None and group[0][0]["step"] < step:
        raise RuntimeError(f"lane items of step {group[0][0]['step']} arrived after step {step} was released")
    while group is not None and group[0][0]["step"] == step:
        buffered[group[0][0]["micro"]] = group
        group = next(it)
    return buffered, group


def _padded_micro(items, lanes, state: dict, where: tuple, rows_per_lane_step: int, micro_batch_size: int,
                  padding) -> list:
    """One (step, micro-batch) of ``lanes``: the lanes' ``items``, and a padding item for every lane that has
    none and owes it. ``state``: ``{lane: LaneCursor}``, updated with what is released. ``where``: ``(step, micro,
    last)``, ``last`` when the micro-batch is this rank's last of the step (a shared lane's entry then covers
    the whole step)."""
    step, micro, last = where
    micros = rows_per_lane_step // micro_batch_size
    got = {}
    for meta, payload in items:
        got.setdefault(meta["lane"], []).append((meta, payload))
        if meta.get("last", True):
            state[meta["lane"]] = LaneCursor.from_dict(meta["state"])
    out = []
    for lane in lanes:
        if lane in got:
            out.extend(got[lane])
        elif state[lane].position(rows_per_lane_step, micro_batch_size) <= (step, micro):
            upto = micros if last else micro + 1  # the lane has not delivered (step, micro) yet
            state[lane] = replace(state[lane], delivered_rows=(step * micros + upto) * micro_batch_size)
            out.append(padding(lane, step, micro, state[lane].to_dict()))
    return out
