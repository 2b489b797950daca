"""The Loader: one data-parallel rank's view of the deterministic pipeline.

Data flow: WorkSource chunks -> units on the runner's workers (read + stateless operators) -> per-lane sequence
reorder -> per-lane accumulators (the dispatcher thread, ``engine.dispatch``; inside ``next()`` for ``inline``), with
flush sentinels -> per-lane row buffers -> tail multiplexer (round-robin over the owned lanes; the builder thread,
``engine.builder``) -> micro-batches.
"""
from __future__ import annotations

import threading
import weakref

from .. import checkpoint as ckpt
from ..checkpoint.skips import stream_ranges
from .accounting import dry_limit, loader_metrics, loader_stats, new_ledger
from .builder import Builder
from .dispatch import Dispatcher, work_inline
from .explain import explain
from .generations import Generations
from .handover import computed, taken
from .lane import LanePipeline
from .metrics import MetricsCounter
from .plan import LoaderPlan
from .runners import Runner, check_runner, make_runner
from .sharing import shared_micro_batches
from .stage import DEFAULT_MAX_SKIP_FRACTION
from .tail import Tail


def _planned(name: str) -> property:
    """A read-only view of the plan's field ``name``."""
    return property(lambda self: getattr(self.plan, name), doc=f"The plan's ``{name}`` (``LoaderPlan``).")


def _stop(owner, name: str, wait: bool = True) -> None:
    """Stop what ``owner.<name>`` holds (dispatcher, builder); clear it once it left (``wait``), else the next iter()
    or close() waits for it, as after an interrupt in the stop. A second stop (another thread's) is harmless."""
    thread = getattr(owner, name)
    if thread is not None:
        thread.stop(wait)
        if wait and getattr(owner, name) is thread:  # not a newer iteration's
            setattr(owner, name, None)


class Loader:
    """Deterministic, elastic loader for one rank.

    Args:
        datasets: ``formats.Dataset`` list (``open_dataset``).
        ops: operators in order, e.g. ``[Decode(), Tokenize(tok, max_length=2048), Pack(2048),
            Shuffle(512), Batch(micro_batch_size=2)]``. A final ``Batch`` gives the micro-batch size and
            ``drop_last`` (default ``Batch(1)``). Leading stateless operators run on workers; the rest on
            the pump, one accumulator per lane.
        weights, seed, shuffle, shuffle_block_size, exhaustion, chunk_size, canonical_replicas, epochs_per_pass: the
            ``WorkSource`` (see there). ``canonical_replicas`` = number of lanes, fixed for the run.
            ``exhaustion="fill"`` extends one pass to a multiple of ``global_batch_size`` samples by
            repeating its first ones (Mosaic's epoch: with one row per sample no step is short).
        global_batch_size: rows per global step, a multiple of ``canonical_replicas`` (default
            ``canonical_replicas * micro_batch_size``). Each lane gives ``global_batch_size /
            canonical_replicas`` rows per step, in micro-batches of ``micro_batch_size`` rows.
        flush_every_k_chunks: chunks between flush sentinels; a fraction (e.g. 0.25) puts sentinels
            inside chunks. The flush span (``flush_every_k_chunks * chunk_size`` pointers per lane, an
            integer) bounds what a resume replays; packing carries its open bins across a flush, a
            shuffle buffer is drained there. Default (None): ``min(chunk_size, 256)`` pointers, or the
            largest ``Shuffle`` buffer_size when larger (so the buffer can fill: a restore then replays
            at most what a cold start fills), which keeps a restore near a cold start at any chunk size.
        flush_span: instead of ``flush_every_k_chunks``, at least this many pointers between sentinels, rounded
            up to whole chunks (a host that states its span in samples, such as Energon's buffers).
        dp_degree, dp_rank, lane_assignment: this rank's lanes (``work.lanes_for_rank``). A ``dp_degree``
            that is a multiple of ``canonical_replicas`` makes ``lane_shares = dp_degree / canonical_replicas``
            ranks share each lane: each runs the whole lane and yields block ``share_index`` of each step's
            rows (``rows_per_rank_step`` rows; ``engine.sharing``); ``rows_per_lane_step`` must then be a
            multiple of ``lane_shares * micro_batch_size``.
        lanes: own only this subset of the rank's lanes (a host loader worker's lanes,
            ``host.worker_lanes``); ``rank_lanes`` keeps the whole rank's. ``[]`` yields nothing.
        emit_state: add ``__state__`` to every micro-batch: its lane's checkpoint entry once that
            micro-batch is consumed (and ``__rows__``, its row count), so the consuming process (a host's
            main process, while workers prefetch) can checkpoint exactly what it used (``host.Progress``).
        pad_tail: with a finite pass and ``Batch(drop_last=False)``, pad the last steps so every lane fills
            them (default); False leaves a lane's last micro-batch short and ends each lane on its own (a
            host whose batches cannot hold padding rows, such as Energon's TaskEncoder batches).
        runner: ``"inline"``, ``"threads"``, ``"processes"`` or a ``Runner`` to share; ``num_workers``. Off
            ``inline``, a dispatcher thread keeps the workers busy while the consumer is away (``engine.dispatch``);
            ``inline`` computes inside ``next()`` (the debugging runner).
        read_ahead_steps: how far each lane works ahead of the consumer, in lane steps (an int >= 1, default 4):
            a lane holds at most about that many steps plus two units of rows (``engine.dispatch``). Memory and
            speed only, never the output.
        max_skip_fraction: the largest fraction (0..1, default 0.5) of a dataset's samples that
            ``on_error="skip"`` may skip, or a list with one per dataset; judged per dataset over what this
            loader read, once 100 of its samples (or this loader's share of one pass, if fewer) were seen.
            Past it, ``DataError`` names the dataset, the fraction and the first errors. An endless stream
            also raises when a dataset gives no record from as many samples as it holds, or a lane no row
            from a whole pass of the data (every sample skipped or filtered): never a silent spin.
        unit_size: the most pointers per unit of worker work (a performance knob only): a lane's first units are
            one lane step's pointers, each next one twice the last, so a first batch reads what it needs.
        batching: which dataset each slot of a step draws from (``work.batching``): ``"random"`` (the mixture,
            default), ``"stratified"`` (each step holds every dataset's rounded share), ``"per_stream"`` (each
            step from one dataset), ``"device_per_stream"`` (each lane step from one dataset). Defined per
            canonical slot, so the same at every dp_degree; needs ``exhaustion="repeat"`` and operators that keep
            one record per pointer (no Shuffle, Pack, Filter or splitting Tokenize; a sample skipped by
            ``on_error="skip"`` shifts its lane's later slots).
    Iterating yields micro-batch dicts (``ops.collate`` of rows) with ``__lane__``, ``__step__`` and
    ``__micro__``; within a step, micro-batch ``j`` of every owned lane in lane order, then ``j + 1``.
    A new ``iter()`` continues where the previous one stopped (or from a ``restore``d state) and
    supersedes it (the older iterator raises ``RuntimeError`` if used again; so does one that was
    live during a ``restore``); after a finite stream (``exhaustion="stop"`` or ``"fill"``) ended it yields
    nothing. A finite pass is split over the lanes evenly (packed: by size, ``work.balance``); with ``Batch(drop_last=
    False)`` its last step is padded (``ops.batch.padding_row``; ``__pad__`` counts a micro-batch's trailing
    padding rows) so every owned lane delivers the same steps (across ranks: ``zephon.host.RankSession``).
    Set ``global_batch_size`` explicitly when the micro-batch size may change between runs: its
    default (``canonical_replicas * micro_batch_size``) would change with it.
    Raises ``TopologyError`` for a dp_degree that neither divides ``canonical_replicas`` nor is a multiple of
    it (or, sharing lanes, a step that does not split into equal blocks of micro-batches), ``ValueError``
    for inconsistent batch sizes, ``formats.DataError`` for bad input while iterating.
    """

    def __init__(self, datasets, ops, *, weights=None, seed: int = 0, canonical_replicas: int = 8,
                 chunk_size: int = 256, global_batch_size: int | None = None, shuffle: bool = True,
                 shuffle_block_size: int | None = None, exhaustion: str = "repeat",
                 flush_every_k_chunks: float | None = None, flush_span: int | None = None,
                 dp_degree: int = 1, dp_rank: int = 0,
                 lane_assignment: str = "contiguous", runner="threads", num_workers: int = 2,
                 unit_size: int = 256, lanes=None, emit_state: bool = False, pad_tail: bool = True,
                 max_skip_fraction=DEFAULT_MAX_SKIP_FRACTION, batching: str = "random",
                 epochs_per_pass=None, read_ahead_steps: int = 4):
        plan = LoaderPlan.build(
            datasets, ops, weights=weights, seed=seed, canonical_replicas=canonical_replicas, chunk_size=chunk_size,
            global_batch_size=global_batch_size, shuffle=shuffle, shuffle_block_size=shuffle_block_size,
            exhaustion=exhaustion, flush_every_k_chunks=flush_every_k_chunks, flush_span=flush_span,
            dp_degree=dp_degree, dp_rank=dp_rank, lane_assignment=lane_assignment, unit_size=unit_size,
            pad_tail=pad_tail, batching=batching, epochs_per_pass=epochs_per_pass)
        self._init(plan, runner=runner, num_workers=num_workers, lanes=lanes, emit_state=emit_state,
                   max_skip_fraction=max_skip_fraction, read_ahead_steps=read_ahead_steps)

    @classmethod
    def from_plan(cls, plan: LoaderPlan, *, runner="threads", num_workers: int = 2, lanes=None,
                  emit_state: bool = False, max_skip_fraction=DEFAULT_MAX_SKIP_FRACTION,
                  read_ahead_steps: int = 4) -> Loader:
        """A Loader of an already computed ``plan`` (``LoaderPlan``); the other arguments as ``Loader``'s."""
        loader = cls.__new__(cls)
        loader._init(plan, runner=runner, num_workers=num_workers, lanes=lanes, emit_state=emit_state,
                     max_skip_fraction=max_skip_fraction, read_ahead_steps=read_ahead_steps)
        return loader

    def _init(self, plan: LoaderPlan, *, runner, num_workers, lanes, emit_state, max_skip_fraction,
              read_ahead_steps) -> None:
        if not isinstance(read_ahead_steps, int) or read_ahead_steps < 1:
            raise ValueError(f"read_ahead_steps must be an int >= 1, got {read_ahead_steps!r}")
        self.read_ahead_steps = read_ahead_steps
        # Held by the consumer while it reads or takes a lane's rows (each next(), checkpoint(), stats()) and by the
        # dispatcher thread while it publishes them (engine.dispatch); notified when rows arrive.
        self._lock = threading.Condition(threading.RLock())
        self._dispatcher: Dispatcher | None = None
        self.plan = plan
        self.lanes = plan.owned_lanes(lanes)
        self.emit_state = emit_state
        check_runner(runner, num_workers, self.stage)  # now: the runner itself starts with the first iteration
        self._runner_spec, self.num_workers = runner, num_workers
        self._runner: Runner | None = runner if isinstance(runner, Runner) else None
        self._owns_runner = not isinstance(runner, Runner)
        self._stop_runner = None  # weakref.finalize closing a runner this loader started (if the loader is collected)
        self._runner_iteration = 0  # the iteration (generation) whose end stops that runner
        self._state: dict[int, LanePipeline] = {}
        self._pending: dict | None = None
        self._generations = Generations()  # iter(), restore() and close() start one: an older iterator must stop
        self.tail = Tail(self)
        self._metrics = MetricsCounter(len(plan.datasets))
        self._skips = (0, 0)  # skipped and filtered by the lanes of iterations before the current one
        self._lane_facts: dict | None = None  # metrics()'s facts read off the lanes at its last read (accounting.py)
        self.max_skip_fraction = max_skip_fraction
        new_ledger(plan, self.lanes, max_skip_fraction)  # validates max_skip_fraction now

    # the plan's facts, read where the Loader is at hand (one representation: the plan)
    datasets = _planned("datasets")
    ops = _planned("ops")
    batch = _planned("batch")
    source = _planned("source")
    canonical_replicas = _planned("canonical_replicas")
    global_batch_size = _planned("global_batch_size")
    rows_per_lane_step = _planned("rows_per_lane_step")
    flush_span = _planned("flush_span")
    unit_size = _planned("unit_size")
    finite = _planned("finite")
    pad_tail = _planned("pad_tail")
    dp_degree = _planned("dp_degree")
    dp_rank = _planned("dp_rank")
    rank_lanes = _planned("rank_lanes")
    lane_shares = _planned("lane_shares")
    share_index = _planned("share_index")
    rows_per_rank_step = _planned("rows_per_rank_step")
    stage = _planned("stage")
    chain_ops = _planned("chain_ops")
    config = _planned("config")
    fingerprint = _planned("fingerprint")
    summary = _planned("summary")

    # -- checkpoints --------------------------------------------------------------------------
    def checkpoint(self) -> dict:
        """This rank's state: JSON-serialisable, a few dozen bytes per owned lane. Reflects what was
        yielded so far (the micro-batch last yielded counts: the consumer has it, even when an exception
        interrupted it right after). Merge all ranks' states with ``merge_states`` to restore at another
        dp_degree."""
        with self._lock:
            return self._checkpoint()

    def _checkpoint(self) -> dict:
        if self._pending is not None:
            entries = [self._pending[lane] for lane in self.lanes]
        elif self._state:
            entries = [self._state[lane].lane_cursor() for lane in self.lanes]
        else:
            entries = ckpt.initial_lanes(self.lanes)
        return self.plan.make_state(entries)

    def restore(self, state: dict, skip_steps=None) -> None:
        """Validate ``state`` now (raises ``CheckpointError`` saying what differs or which lanes are
        missing); apply it when iteration next starts. A global (merged) or this rank's own state.

        skip_steps: ``(a, b)`` (or a list of them): the global steps ``a..b-1`` are not delivered, step ``a``
            delivers what ``b`` would have (steps as training counts them). The checkpoint's own skips are kept;
            later checkpoints record them all (``LoaderPlan.with_restored_skips``, which raises ``CheckpointError``
            for a skip that starts before the checkpoint's step)."""
        ckpt.check_given(state, "Loader.restore")  # bytes, a str path or a list: say what it expects
        plan = self.plan.with_restored_skips(state, skip_steps)
        by_lane = plan.validate(state, self.lanes)
        with self._lock:
            self.plan = plan
            self._pending = {lane: by_lane[lane] for lane in self.lanes}
            self._generations.bump("restore()")  # what was built and not delivered is never delivered
        _stop(self.tail, "builder")  # the superseded iteration's (outside the lock: it may be building)

    def explain(self, steps, state: dict | None = None, text_field: str | None = None) -> dict:
        """Every row of the global batches of ``steps`` (a step or a range): lane, micro-batch, and each source
        document piece it holds, computed from the config (``engine.explain.explain``, which documents the
        arguments and the result); this loader's skipped steps apply."""
        return explain(self.plan, steps, state=state, text_field=text_field)

    # -- iteration ------------------------------------------------------------------------------
    def _start(self) -> None:
        _stop(self.tail, "builder")  # the last iteration's (its micro-batches built and not taken are not delivered)
        if self._pending is not None:
            entries = self._pending
        else:  # a new iteration continues where the last one stopped
            entries = {lane: st.lane_cursor() for lane, st in self._state.items()}
        self._pending = None
        _stop(self, "_dispatcher")  # the last iteration's: its lanes are replaced now
        if self._runner is None:
            self._runner = make_runner(self._runner_spec, self.stage, self.num_workers)
            self._stop_runner = weakref.finalize(self, self._runner.close, False)  # a collection never waits
        ledger, dry = new_ledger(self.plan, self.lanes, self.max_skip_fraction), dry_limit(self.plan)
        rps = self.rows_per_lane_step
        skipped = [(lo * rps, hi * rps) for lo, hi in stream_ranges(self.plan.skips)]
        old = self._state.values()
        self._skips = (self._skips[0] + sum(s.skipped for s in old), self._skips[1] + sum(s.filtered for s in old))
        self._state = {lane: LanePipeline(lane, self.source, self.chain_ops, self.datasets, span=self.flush_span,
                                       unit_size=self.unit_size, start=entries.get(lane), ledger=ledger,
                                       dry_limit=dry, skipped=skipped, metrics=self._metrics,
                                       first_unit=rps)
                       for lane in self.lanes}
        if self._runner.name != "inline":  # inline computes inside next() by definition (engine.dispatch)
            self._dispatcher = Dispatcher(self._state, list(self.lanes), self._runner, self._lock,
                                          self.read_ahead_steps * rps)

    def __iter__(self):
        return self._steps()

    def _steps(self):
        """This rank's micro-batches, each counted as delivered once ``next()`` returns it (``Tail.deliver``), the
        time inside ``next()`` counted as the consumer's wait. The workers and the builder belong to this
        iteration: they stop when it is exhausted, closed, raises or is garbage-collected (the workers unless a
        newer iteration took them over); the next iteration starts new ones."""
        if not self.lanes:  # a host worker with no lanes: end at once, start nothing
            return
        self._start()
        self._runner_iteration = generation = self._generations.bump("iter()")
        items = self.tail.steps(generation)
        if self.lane_shares > 1:  # more ranks than lanes: keep this rank's block of each step
            items = shared_micro_batches(self, items)
        builder = None
        try:
            # The inline runner computes inside next() by definition; so does a shared lane (its filter delivers
            # the other ranks' blocks in the lane's order, on the consumer's thread).
            if self._dispatcher is None or self.lane_shares > 1:
                poke = None if self._dispatcher is None else self._dispatcher.poke
                yield from computed(items, self._lock, self.tail.deliver, self._metrics.add_wait, poke)
            else:
                builder = self.tail.builder = Builder(items, self._lock, self._dispatcher.poke)
                builder.start()
                yield from taken(builder, self.tail.deliver, self._metrics.add_wait,
                                 lambda: self.check_generation(generation))
        except Exception as e:
            if self._generations.current != generation:  # closed, restored or iterated anew meanwhile
                raise self._generations.ended() from e
            raise
        finally:
            # The iteration's own end (exhausted, raised, Ctrl-C, abandoned: maybe a finalizer, on a thread holding
            # any lock) waits for no thread and no unit in flight; a new iter() or an explicit close() waits.
            try:
                if builder is not None:
                    builder.stop(wait=False)
                else:  # the builder closes what it runs
                    items.close()
            finally:  # a Ctrl-C in the builder's stop still stops the dispatcher and the workers
                if self._runner_iteration == generation:
                    self._close(wait=False)

    # -- what the tail multiplexer (engine/tail.py) reads of the lanes --------------------------------
    def lane(self, lane: int) -> LanePipeline:
        """The pipeline of owned lane ``lane`` in the current iteration."""
        return self._state[lane]

    def lane_pipelines(self) -> list[LanePipeline]:
        """The owned lanes' pipelines of the current iteration, in lane order."""
        return [self._state[lane] for lane in self.lanes if lane in self._state]

    def check_generation(self, generation: int) -> None:
        """Raise ``RuntimeError`` when the iteration ``generation`` was ended by a newer ``iter()``, a ``restore()``
        or ``close()`` (``engine.generations``), saying which."""
        self._generations.check(generation)

    @property
    def dropped_rows(self) -> int:
        """Rows of a finite pass's incomplete last step dropped (``Batch(drop_last=True)``), counted."""
        return self.tail.dropped_rows

    @property
    def padded_rows(self) -> int:
        """Padding rows delivered in a finite pass's last steps (``Batch(drop_last=False)``)."""
        return self.tail.padded_rows

    def ensure(self, lane: int, n: int) -> None:
        """Work (inline) or wait for the dispatcher (``engine.dispatch``) until ``lane`` holds ``n`` rows
        (``float("inf")``: all) or has ended. Raises the lane's ``DataError`` (or a worker's error) when its rows
        stop short of ``n``."""
        with self._lock:
            if self._dispatcher is not None:
                builder = self.tail.builder  # a stopped builder stops waiting (it never holds a close() back)
                self._dispatcher.wait_rows(lane, n, None if builder is None else builder.is_stopped)
                return
            # Steps, not units, in flight: the other lanes work toward the step being built until this iteration
            # delivered one (so a start or a restore reads what its first step needs), then one step further.
            done = self.tail.steps_done
            through = (done + (2 if done else 1)) * self.rows_per_lane_step
            work_inline(self._state, self.lanes, self._runner, lane, n, through)

    # -- reporting ------------------------------------------------------------------------------
    def stats(self) -> dict:
        """Counts for this loader's owned lanes. Since this iteration started, over the work processed
        (read-ahead included, a replayed span counted again, so they vary with prefetch): ``skipped``
        samples (bad input in skip mode, with up to 20 ``skipped_messages`` naming them), ``filtered``
        records, ``replayed_rows`` (regenerated on resume, not re-delivered). ``dropped_rows``: a finite
        stream's incomplete last step with drop_last; ``padded_rows``: padding rows of a finite stream's last
        step without it (this iteration). ``delivered_rows``: yielded since the start of
        training (restored counts included; the checkpoint's per-lane ``delivered_rows`` also counts
        dropped rows, as consumed). When ranks share a lane (``lane_shares`` > 1) the row counts are this rank's
        block of the lane's rows (``sharing.shared_stats``); the other counts are the whole lane's work."""
        with self._lock:
            return loader_stats(self)

    def metrics(self) -> dict:
        """What this loader did since it was built (all its iterations; rows and datasets as delivered, time and work
        with a resume's replay, at most a flush span per lane), cheap to read at any time (from any thread):

        ``datasets``: per dataset name, ``samples`` and ``tokens`` delivered (docs/metrics.md says how), their
        ``sample_share`` / ``token_share`` and the mixture's ``target_share`` (sample weights, at the current
        step under a schedule); ``rows``, ``micro_batches``, ``padding_rows`` (a finite pass's last steps),
        ``tokens`` (in delivered rows), ``padding_tokens`` and ``padding_fraction`` (of delivered rows' slots);
        ``skipped`` / ``filtered`` samples; ``stage_s``: seconds per stage (``read``, each operator by name;
        worker stages summed over workers); ``consumer_wait_s`` and ``consumer_wait_fraction`` (of ``elapsed_s``:
        time spent inside ``next()``, the loader making the training loop wait); ``worker_utilization`` (worker
        seconds / (elapsed x workers)); ``units``; ``remote``: this process's object-storage downloads and bytes.
        Never waits for the inline runner's work inside ``next()`` (``target_share``, ``skipped`` and ``filtered``
        are then as of the previous read). Exporters: ``zephon.host.metrics``; docs/metrics.md."""
        return loader_metrics(self)

    def close(self) -> None:
        """Stop worker threads/processes this loader started (a shared runner is left running). An iteration
        also stops them when it ends; ``with Loader(...) as loader:`` calls this on leaving the block."""
        self._close(wait=True)

    def _close(self, wait: bool) -> None:
        if self._runner_iteration == self._generations.current:
            self._generations.bump("close()")  # the open iterator ends at its next micro-batch, saying why
        try:  # each stop runs even when an interrupt ends the one before
            _stop(self.tail, "builder", wait)
        finally:
            try:
                _stop(self, "_dispatcher", wait)
            finally:
                runner = self._runner
                if runner is not None and self._owns_runner:
                    self._runner = None  # first: a closed runner must never serve a new iter() (an interrupt below)
                    runner.close(wait)
                    self._stop_runner.detach()  # only once closed: else the loader's collection closes it

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
