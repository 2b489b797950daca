"""``LoaderPlan``: a loader's derived configuration, computed once from its config and validated.

Everything that is a function of the config alone lives here (the WorkSource, the micro-batch and step sizes,
the flush span, this rank's lanes and lane sharing, the stage run on workers and the chain run on the pump,
the checkpoint fingerprint). ``Loader``, ``host.RankSession``, the adapters and ``zephon verify`` read it;
nobody builds a Loader to learn a number. It is frozen: a rank with another dp_degree gets its own plan
(``for_rank``), every other fact stays. See docs/concepts.md ("plan").
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

from .. import checkpoint as ckpt
from ..checkpoint.skips import SKIPS_KEY, check_skips, skip_in_state, skipped_rows, stream_ranges
from ..ops.batch import Batch
from ..work import WorkSource, check_replicas, check_share_rows, lane_share, lanes_for_rank
from .checks import check_datasets, check_finite_lanes, check_ops
from .carry import carrier_indexes
from .rowsplit import row_split
from .stage import WorkStage


def dataset_names(datasets) -> list[str]:
    """One name per dataset, as ``metrics()``, ``explain`` and ``diff`` report them: its ``name`` (``dataset{i}``
    without one), ``name#i`` when several datasets share it (one folder opened twice)."""
    names = [getattr(d, "name", None) or f"dataset{i}" for i, d in enumerate(datasets)]
    return [n if names.count(n) == 1 else f"{n}#{i}" for i, n in enumerate(names)]


@dataclass(frozen=True)
class LoaderPlan:
    """A loader's derived configuration (build it with ``LoaderPlan.build``).

    Fields: ``datasets``, ``ops`` (the operators without the final ``Batch``), ``batch`` (the ``Batch``),
    ``source`` (the ``WorkSource``), ``canonical_replicas`` (lanes), ``global_batch_size`` (rows per global
    step), ``rows_per_lane_step`` (rows a lane gives per step), ``flush_span`` (pointers of a lane between two
    flush sentinels), ``unit_size`` (pointers per unit of worker work), ``finite`` (a pass ends),
    ``pad_tail``, ``dp_degree``, ``dp_rank``, ``lane_assignment``, ``rank_lanes`` (this rank's lanes),
    ``lane_shares`` (ranks sharing each lane, 1 when a rank owns whole lanes), ``share_index`` (this rank's
    block of a shared lane's steps), ``rows_per_rank_step`` (rows of a lane step this rank delivers),
    ``stage`` (datasets and the stateless operators run on workers), ``chain_ops`` (operators run on the pump
    from the first accumulator on), ``config`` (plain data), ``fingerprint`` (its digest), ``summary``,
    ``skips`` (skipped step ranges ``[[a, b], ...]`` a resume added, ``checkpoint.skips``; in ``config`` when any).
    The lists and dicts are the plan's own: read them, never change them."""

    datasets: list
    ops: list
    batch: Batch
    source: WorkSource
    canonical_replicas: int
    global_batch_size: int
    rows_per_lane_step: int
    flush_span: int
    unit_size: int
    finite: bool
    pad_tail: bool
    dp_degree: int
    dp_rank: int
    lane_assignment: str
    rank_lanes: list
    lane_shares: int
    share_index: int
    rows_per_rank_step: int
    stage: WorkStage
    chain_ops: list
    config: dict
    fingerprint: str
    summary: dict
    skips: list = dataclasses.field(default_factory=list)

    @classmethod
    def build(cls, datasets, ops, *, weights=None, seed: int = 0, canonical_replicas: int = 8,
              chunk_size: int = 256, global_batch_size: int | None = None, shuffle: bool = True,
              shuffle_block_size: int | None = None, exhaustion: str = "repeat",
              flush_every_k_chunks: float | None = None, flush_span: int | None = None, dp_degree: int = 1,
              dp_rank: int = 0, lane_assignment: str = "contiguous", unit_size: int = 256,
              pad_tail: bool = True, batching: str = "random",
              epochs_per_pass=None, step_major: bool = False) -> LoaderPlan:
        """The plan of a loader built with these arguments (``Loader``'s, which documents each).

        Raises ``TopologyError`` for a dp_degree that neither divides ``canonical_replicas`` nor is a multiple
        of it (or, sharing lanes, a step that does not split into equal blocks of micro-batches),
        ``ValueError`` for inconsistent batch sizes, a bad flush span or a misplaced ``Batch``."""
        datasets = check_datasets(datasets)
        ops = list(ops)
        batch = ops.pop() if ops and isinstance(ops[-1], Batch) else Batch(1)
        if any(isinstance(op, Batch) for op in ops):
            raise ValueError("Batch must be the last operator")
        m = batch.micro_batch_size
        check_replicas(canonical_replicas)
        gbs = canonical_replicas * m if global_batch_size is None else global_batch_size
        if not isinstance(gbs, int) or gbs < 1 or unit_size < 1:
            raise ValueError(f"global_batch_size and unit_size must be >= 1, got {global_batch_size}, {unit_size}")
        n_work = next((i for i, op in enumerate(ops) if op.stateful), len(ops))
        stage = WorkStage(datasets, ops[:n_work])
        source = WorkSource(datasets, weights, seed=seed, canonical_replicas=canonical_replicas,
                            chunk_size=chunk_size, shuffle=shuffle, shuffle_block_size=shuffle_block_size,
                            exhaustion=exhaustion, fill_multiple=gbs, step_size=gbs, batching=batching,
                            epochs_per_pass=epochs_per_pass, step_major=step_major,
                            split="size" if any(op.name == "pack" for op in ops) else "count",  # rows follow tokens
                            # whole rows per lane where the tail is not padded (padded, equal shares pad least)
                            rows=row_split(stage, ops) if batch.drop_last or batch.short_last or not pad_tail
                            else None)
        check_ops(ops, len(datasets))
        moving = [op.name for op in ops if op.stateful or op.name == "filter"
                  or (op.name == "tokenize" and op.max_length is not None)]
        if batching != "random" and moving:
            raise ValueError(f"batching={batching!r} gives each slot of a step its dataset, one record per pointer; "
                             f"operators {moving} move, merge, split or drop records across slots (a shuffle "
                             f"buffer, packing, a filter, a Tokenize(max_length=...) that splits documents), which "
                             f"would undo it: use batching='random' with them")
        if gbs % canonical_replicas:
            raise ValueError(f"global_batch_size={gbs} is not a multiple of canonical_replicas={canonical_replicas}")
        rows_per_lane_step = gbs // canonical_replicas
        if rows_per_lane_step % m:
            raise ValueError(f"micro_batch_size={m} does not divide the {rows_per_lane_step} rows each lane "
                             f"gives per step (global_batch_size / canonical_replicas)")
        flush_span = _flush_span(ops, chunk_size, flush_every_k_chunks, flush_span)
        finite = source.total_positions is not None
        if finite and (batch.drop_last or pad_tail):
            check_finite_lanes(source)
        config = {"version": 1, "algorithm": ckpt.ALGORITHM_VERSION, "work": source.fingerprint(),
                  "ops": [op.fingerprint() for op in ops] + [batch.fingerprint()],
                  "global_batch_size": gbs, "flush_span": flush_span}
        plan = cls(datasets=datasets, ops=ops, batch=batch, source=source,
                   canonical_replicas=canonical_replicas, global_batch_size=gbs,
                   rows_per_lane_step=rows_per_lane_step, flush_span=flush_span, unit_size=unit_size,
                   finite=finite, pad_tail=pad_tail, dp_degree=1, dp_rank=0, lane_assignment=lane_assignment,
                   rank_lanes=[], lane_shares=1, share_index=0, rows_per_rank_step=rows_per_lane_step,
                   stage=stage, chain_ops=ops[n_work:], config=config,
                   # a schedule is compared by source.check_resume, not by the fingerprint
                   fingerprint=ckpt.config_digest(config), summary=ckpt.summarize_config(config))
        return plan.for_rank(dp_degree, dp_rank, lane_assignment)

    def for_rank(self, dp_degree: int, dp_rank: int, lane_assignment: str | None = None) -> LoaderPlan:
        """This plan for rank ``dp_rank`` of ``dp_degree`` (``lane_assignment``: None keeps this plan's).

        Raises ``TopologyError`` as ``build`` does."""
        assignment = self.lane_assignment if lane_assignment is None else lane_assignment
        rank_lanes = lanes_for_rank(self.canonical_replicas, dp_degree, dp_rank, assignment)
        # dp_degree a multiple of canonical_replicas: ranks share a lane, each keeping a block of its steps
        shares, index = lane_share(self.canonical_replicas, dp_degree, dp_rank, assignment)
        rows = check_share_rows(self.rows_per_lane_step, self.batch.micro_batch_size, shares)
        return dataclasses.replace(self, dp_degree=dp_degree, dp_rank=dp_rank, lane_assignment=assignment,
                                   rank_lanes=list(rank_lanes), lane_shares=shares, share_index=index,
                                   rows_per_rank_step=rows)

    @property
    def micro_batch_size(self) -> int:
        """Rows per micro-batch (the final ``Batch``'s)."""
        return self.batch.micro_batch_size

    def owned_lanes(self, lanes=None) -> list[int]:
        """The lanes a loader of this rank owns: all of ``rank_lanes`` (``lanes`` None) or the given subset.

        Raises ``ValueError`` for a lane of another rank or a repeated lane."""
        if lanes is None:
            return list(self.rank_lanes)
        owned = [int(x) for x in lanes]
        foreign = sorted(set(owned) - set(self.rank_lanes))
        if foreign or len(set(owned)) != len(owned):
            raise ValueError(f"lanes={list(lanes)} must be distinct lanes of dp_rank {self.dp_rank}, which owns "
                             f"{self.rank_lanes[0]}..{self.rank_lanes[-1]} ({self.lane_assignment}); "
                             f"foreign: {foreign}")
        return owned

    def make_state(self, cursors) -> dict:
        """A checkpoint of this config holding ``cursors`` (``LaneCursor``s or lane entries; see
        ``checkpoint.make_state``, which raises ``CheckpointError`` for a malformed entry)."""
        return ckpt.make_state(self.fingerprint, self.summary, self.canonical_replicas, self.rows_per_lane_step,
                               cursors)

    def config_diff(self, summary: dict) -> list[str]:
        """What differs between this plan's config and a checkpoint's ``summary`` (its ``config``), one
        phrase per difference (``checkpoint.config_diff``); empty when the summaries agree."""
        return ckpt.config_diff(self.summary, summary)

    def with_skips(self, skips) -> LoaderPlan:
        """This plan with the skipped step ranges ``skips`` (``[[a, b], ...]`` stream steps, see
        ``checkpoint.skips``; stored normalized) instead of its own; the fingerprint stays."""
        skips = [list(s) for s in stream_ranges(skips)]
        config = {k: v for k, v in self.config.items() if k != SKIPS_KEY}
        if skips:
            config[SKIPS_KEY] = skips
        return dataclasses.replace(self, skips=skips, config=config, summary=ckpt.summarize_config(config))

    def skips_of(self, state: dict | None) -> list:
        """The skipped step ranges of checkpoint ``state`` (this plan's for None). Raises ``CheckpointError``
        for a malformed list."""
        if state is None:
            return [list(s) for s in self.skips]
        try:
            return check_skips((state.get("config") or {}).get(SKIPS_KEY, []))
        except ValueError as e:
            raise ckpt.CheckpointError(f"checkpoint: {e}") from None

    def with_period(self, period: int) -> LoaderPlan:
        """This plan over quota pass ``period`` of its source (``WorkSource.with_period``), fingerprinted as such.
        Raises ``ValueError`` for a source without a quota."""
        source = self.source.with_period(period)
        config = dict(self.config, work=source.fingerprint())
        return dataclasses.replace(self, source=source, config=config, fingerprint=ckpt.config_digest(config),
                                   summary=ckpt.summarize_config(config))

    def with_restored_skips(self, state: dict, skip_steps=None) -> LoaderPlan:
        """The plan a restore of ``state`` runs: this one with the checkpoint's skipped steps, plus ``skip_steps``
        (``(a, b)`` or a list of them, all in the step numbers of the resumed run: global steps ``a..b-1`` are not
        delivered, step ``a`` delivers what ``b`` would have). Raises ``CheckpointError`` for a skip that starts
        before the checkpoint's step (naming it) or a malformed one."""
        skips = self.skips_of(state)
        if skip_steps is not None:
            try:
                skips = self.skips_of(skip_in_state(state, skip_steps))
            except ValueError as e:
                raise ckpt.CheckpointError(str(e)) from None
        return self.with_skips(skips)

    def validate(self, state: dict, lanes) -> dict:
        """Check that ``state`` restores ``lanes`` under this plan; returns ``{lane: LaneCursor}``.

        Raises ``CheckpointError`` saying what differs (config, lanes missing, a sentinel off the flush
        boundary, records carried into an operator that carries nothing)."""
        by_lane = ckpt.validate(state, self.fingerprint, self.summary, lanes=lanes,
                                resume_check=self.source.check_resume)
        carriers = {str(i) for i in carrier_indexes(self.chain_ops)}
        chunk = self.source.chunk_size
        skips = self.skips_of(state)
        for lane in lanes:
            c = by_lane[lane]
            if c.skipped_rows != skipped_rows(c.delivered_rows, self.rows_per_lane_step, skips):
                raise ckpt.CheckpointError(f"lane {lane}: skipped_rows {c.skipped_rows} does not match the "
                                           f"checkpoint's skipped steps {skips} (an edited checkpoint?)")
            if c.first_pointer(chunk) % self.flush_span or c.sentinel_offset >= chunk:
                raise ckpt.CheckpointError(f"lane {lane}: sentinel ({c.sentinel_chunk}, {c.sentinel_offset}) "
                                           f"is not on a flush boundary (every {self.flush_span} pointers)")
            bad = sorted(set(c.carry or {}) - carriers)
            if bad:
                raise ckpt.CheckpointError(f"lane {lane}: the checkpoint carries records into operator(s) {bad}, "
                                           f"which carry nothing in this pipeline (an edited checkpoint?)")
        return by_lane


def _flush_span(ops, chunk_size: int, flush_every_k_chunks, flush_span) -> int:
    """Pointers of a lane between two flush sentinels (see ``Loader``'s ``flush_every_k_chunks`` and
    ``flush_span``).

    Raises ``ValueError`` when both are given, for a ``flush_span`` that is not an int >= 1, or unless
    ``flush_every_k_chunks x chunk_size`` is a whole number >= 1."""
    if flush_span is not None:
        if flush_every_k_chunks is not None:
            raise ValueError(f"give flush_span={flush_span} or flush_every_k_chunks={flush_every_k_chunks}, not both")
        if not isinstance(flush_span, int) or isinstance(flush_span, bool) or flush_span < 1:
            raise ValueError(f"flush_span must be an int >= 1 (pointers per lane), got {flush_span!r}")
        return -(-flush_span // chunk_size) * chunk_size  # whole chunks: at least flush_span pointers
    if flush_every_k_chunks is None:  # a shuffle buffer fills once per span; a restore replays one at most
        buffers = [op.buffer_size for op in ops if getattr(op, "name", "") == "shuffle"]
        return max([min(chunk_size, 256)] + buffers)
    span = flush_every_k_chunks * chunk_size
    if not math.isfinite(span) or span < 1 or span != int(span):
        raise ValueError(f"flush_every_k_chunks={flush_every_k_chunks} x chunk_size={chunk_size} must be a "
                         f"whole number of pointers >= 1")
    return int(span)
