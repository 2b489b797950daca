"""``RankSession``: one data-parallel rank of a host loader, on both sides of the host's worker processes.

Worker side: a worker's lanes run in its own ``Loader``, which starts from the state
the rank last consumed and sends ``(meta, payload)`` items, one per lane micro-batch (or several, when a
host hook turns one micro-batch into several batches). Consuming side: the items, in whatever order the
host interleaves its workers, are put back into the rank's order (step, micro-batch, lane), a finite
stream's end is agreed across lanes and ranks, and each lane's checkpoint entry is recorded as its last
item is handed to the training loop. So the rank's checkpoint is exactly what was consumed, whatever the
worker count and prefetch depth. Adapters translate host keywords and shapes onto this and nothing else.
"""
from __future__ import annotations

import logging

from .. import checkpoint as ckpt
from ..engine import Loader, LoaderPlan, empty_row
from ..engine.explain import explain
from ..engine.stage import DEFAULT_MAX_SKIP_FRACTION
from ..ops.batch import collate, empty_micro_batch, padding_micro_batch, padding_row
from .agreement import StepAgreement, _dist, agreed_steps, padded_steps, short_steps
from .assembly import StepAssembly
from .progress import Progress, initial_state
from .ranks import rank_checkpoint, restorable
from .workers import bundled, exit_with_parent, host_worker_runner, worker_lanes

log = logging.getLogger("zephon")

# The words a warning uses for the user's settings; an adapter passes its host's (``warn_context``).
CORE_WORDS = {"host": "zephon.Loader", "drop_last": "Batch(drop_last={})", "finite": "exhaustion='stop'",
              "dropped": "dropped_rows"}
_warned: set = set()  # (warning, config fingerprint, host) already logged in this process


def warn_once(key: tuple, message: str, *args) -> bool:
    """Log ``message % args`` on the "zephon" logger once per process for ``key``; returns whether it logged."""
    if key in _warned:
        return False
    _warned.add(key)
    log.warning(message, *args)
    return True


class RankSession:
    """Host-loader plumbing for one rank.

    Args:
        plan: this rank's ``engine.LoaderPlan`` (``RankSession.from_config`` builds it from Loader keywords).
        loader_options: keywords of the worker loaders besides the plan (``max_skip_fraction``); each worker
            iteration runs ``Loader.from_plan(plan, lanes=its lanes, emit_state=True, ...)``.
        agreement_group: the torch.distributed group whose ranks agree on a finite stream's end (None:
            the whole job).
        agree_end: False when the host itself stops every rank at the same step (a step count known in
            advance, such as Mosaic's epoch length): ``groups`` then takes no per-step vote.
        warn_context: the host's words for what warnings name, merged over ``CORE_WORDS``: ``host`` (what
            the user built, e.g. ``"zephon_energon.get_train_dataset"``), ``drop_last`` (a ``str.format``
            template of the keyword that sets it, e.g. ``"batch_drop_last={}"``), ``finite`` (what made the
            pass finite, e.g. ``"repeat=False"``), ``dropped`` (where the count is read). A warning is logged
            once per process and config.
    A finite pass without drop_last ends with padding micro-batches where a lane (of this rank, or of a rank
    that ran out) has no row, so every rank delivers the same steps, unless the loader says ``pad_tail=False``
    (the host's items are not plain micro-batches, e.g. a TaskEncoder's batches): the ranks then stop at the
    first step some rank lacks, the rest counted.
    Attributes: ``plan``, ``dropped_rows`` (rows of a finite pass's incomplete tail, in
    every worker and rank agreement). Picklable (host workers get a copy; the agreement is not sent).
    Raises what ``Loader`` raises (``TopologyError``, ``ValueError``, ``CheckpointError``)."""

    def __init__(self, plan, *, loader_options=None, agreement_group=None, agree_end: bool = True,
                 warn_context=None):
        self.plan = plan
        self._options = dict(loader_options or {})
        self.words = dict(CORE_WORDS, **(warn_context or {}))
        self._agree_end = agree_end
        self._template = None  # a delivered micro-batch: the shape of padding
        self._start = self.initial_state()  # the rank checkpoint the next worker iteration starts from
        self.progress = Progress(plan, self._start)
        self.dropped_rows = 0
        self._agreement_group = agreement_group
        self._agreement = None

    @classmethod
    def from_config(cls, datasets, ops, *, max_skip_fraction=DEFAULT_MAX_SKIP_FRACTION, agreement_group=None,
                    agree_end: bool = True, warn_context=None, **config) -> RankSession:
        """A session of the loader ``Loader(datasets, ops, **config)`` would be (``config``: its keywords but
        the runner's, ``lanes`` and ``emit_state``, which the session sets per worker iteration).

        Raises what ``LoaderPlan.build`` raises (``TopologyError``, ``ValueError``)."""
        return cls(LoaderPlan.build(datasets, ops, **config), loader_options={"max_skip_fraction": max_skip_fraction},
                   agreement_group=agreement_group, agree_end=agree_end, warn_context=warn_context)

    def __getstate__(self):
        state = dict(self.__dict__)
        state["_agreement"] = state["_agreement_group"] = None  # process groups do not cross processes
        return state

    # -- config views ---------------------------------------------------------------------------
    @property
    def rank_lanes(self) -> list[int]:
        return list(self.plan.rank_lanes)

    @property
    def finite_drop_last(self) -> bool:
        """A finite pass whose incomplete last step is dropped: ranks must agree where it ends."""
        return self.plan.finite and self.plan.batch.drop_last

    # -- worker side ------------------------------------------------------------------------------
    def worker_loader(self, num_workers: int = 0, worker_id: int = 0, runner=None, workers=None):
        """A ``Loader`` over worker ``worker_id`` of ``num_workers``'s lanes (0 workers:
        the whole rank), starting from the session's current state; None when the share is empty.
        ``runner``, ``workers``: its runner and worker count (None: ``host_worker_runner``'s, a thread that reads
        ahead)."""
        lanes = None if num_workers == 0 else worker_lanes(self.rank_lanes, num_workers, worker_id)
        if lanes == []:
            return None
        if num_workers:
            exit_with_parent()  # a host's worker process ends with the training process (it may be killed)
        runner, workers = host_worker_runner(runner, workers)
        L = Loader.from_plan(self.plan, lanes=lanes, runner=runner, num_workers=workers, emit_state=True,
                             **self._options)
        L.restore(self._start)
        return L

    def worker_items(self, num_workers: int = 0, worker_id: int = 0, *, finish=None, runner=None,
                     workers=None):
        """Iterate this worker's lanes and yield ``(meta, payload)``.

        meta: ``lane``, ``step``, ``micro``, ``rows`` (rows of the lane micro-batch), ``state`` (its lane's
        checkpoint entry once consumed), ``last`` (the micro-batch's final item), ``skip`` (an item that
        only carries the state: ``finish`` returned nothing). payload: the micro-batch without its
        bookkeeping keys, or each of ``finish(mb)``'s results. A finite stream's rows this worker dropped
        end the stream as ``({"dropped_rows": n}, None)``."""
        L = self.worker_loader(num_workers, worker_id, runner, workers)
        if L is None:  # a worker with no lanes ends at once (the host skips it)
            return
        try:
            for mb in L:
                meta = {"lane": mb.pop("__lane__"), "step": mb.pop("__step__"), "micro": mb.pop("__micro__"),
                        "rows": mb.pop("__rows__"), "state": mb.pop("__state__"), "pad": mb.pop("__pad__", 0)}
                payloads = [mb] if finish is None else list(finish(mb))
                if not payloads:
                    yield dict(meta, last=True, skip=True), None
                for k, p in enumerate(payloads):
                    yield dict(meta, last=k == len(payloads) - 1, skip=False), p
            if L.dropped_rows:
                yield {"dropped_rows": L.dropped_rows}, None
        finally:
            L.close()

    def worker_bundles(self, num_workers: int = 0, worker_id: int = 0, positions: int = 1, items=None,
                       **item_kwargs):
        """This worker's items in lists of ``positions`` consecutive (step, micro-batch) positions of its lanes
        (``workers.bundled``): what a host's worker hands over, one list per host item.
        items: the worker's ``(meta, payload)`` items (default ``worker_items(num_workers, worker_id,
        **item_kwargs)``), from this session's start."""
        if items is None:
            items = self.worker_items(num_workers, worker_id, **item_kwargs)
        lanes = self.rank_lanes if num_workers == 0 else worker_lanes(self.rank_lanes, num_workers, worker_id)
        L = self.plan
        starts = {c.lane: c.position(L.rows_per_lane_step, L.batch.micro_batch_size) for c in self.start_cursors()}
        return bundled(items, lanes, {lane: starts[lane] for lane in lanes}, positions)

    # -- consuming side ---------------------------------------------------------------------------
    def begin(self) -> None:
        """Before the host starts its workers: they continue from what was consumed."""
        self._start = self.progress.checkpoint()

    def groups(self, items, stream: bool = False):
        """Workers' ``items`` (any interleaving) -> lists of ``(meta, payload)``, one per (step,
        micro-batch), in lane order; a finite pass ends on the step every lane and rank completes. Records
        nothing (see ``consumed``). ``stream`` (an endless stream only): lists of the items now in order instead,
        so the first item does not wait for its whole group."""
        L = self.plan
        start = self.progress.cursors()
        asm = StepAssembly(L.rank_lanes, start, L.rows_per_lane_step, L.batch.micro_batch_size)

        def ordered():
            for meta, payload in items:
                if "dropped_rows" in meta:  # a worker's lanes ended inside a step (drop_last)
                    self.dropped_rows += meta["dropped_rows"]
                    continue
                if self._template is None and isinstance(payload, dict) and not meta.get("skip"):
                    self._template = payload
                args = meta["step"], meta["micro"], meta["lane"], (meta, payload)
                if stream:
                    yield asm.stream(*args, last=meta["last"])
                else:
                    yield from asm.add(*args, last=meta["last"])
            yield from asm.finish()

        finite = L.finite and self._agree_end
        if stream and finite:
            raise ValueError("groups(stream=True) needs an endless stream (a finite pass ends on agreed steps)")
        dist = _dist()
        if finite and L.batch.short_last:  # only real rows; a rank with none gets 0-row micro-batches
            return short_steps(ordered(), L.rank_lanes, start, L.rows_per_lane_step, L.batch.micro_batch_size,
                               self._vote(), self._empty, share=(L.lane_shares, L.share_index))
        if finite and not L.batch.drop_last and L.pad_tail:
            return padded_steps(ordered(), L.rank_lanes, start, L.rows_per_lane_step, L.batch.micro_batch_size,
                                self._vote(), self._padding, share=(L.lane_shares, L.share_index))
        if not finite or not (L.batch.drop_last or (dist is not None and dist.get_world_size() > 1)):
            return ordered()
        delivered = {c.lane: c.delivered_rows for c in start}
        on_drop = self._count_dropped if L.batch.drop_last else self._count_uneven_tail
        return agreed_steps(ordered(), delivered, L.rows_per_lane_step, self._vote(), on_drop,
                            whole_steps=L.batch.drop_last)

    def _vote(self) -> StepAgreement:
        """The per-step vote over the agreement group (made on first use: process groups do not pickle)."""
        if self._agreement is None:
            self._agreement = StepAgreement(self._agreement_group)
        return self._agreement

    def _empty(self, lane: int, step: int, micro: int, state: dict):
        """A 0-row item for ``lane`` at (``step``, ``micro``) (``short_steps``), shaped like a delivered one."""
        meta = {"lane": lane, "step": step, "micro": micro, "rows": 0, "state": state, "last": True, "skip": False,
                "pad": 0}
        return meta, empty_micro_batch(self._padding(lane, step, micro, state)[1])

    def _padding(self, lane: int, step: int, micro: int, state: dict):
        """A padding item for ``lane`` at (``step``, ``micro``) (``padded_steps``), shaped like a delivered one."""
        m = self.plan.batch.micro_batch_size
        meta = {"lane": lane, "step": step, "micro": micro, "rows": m, "state": state, "last": True, "skip": False,
                "pad": m}
        if self._template is not None:
            return meta, padding_micro_batch(self._template, m)
        row = empty_row(self.plan.chain_ops)  # packed rows have a known shape, delivered or not
        if row is None:
            raise RuntimeError(f"rank lanes {self.rank_lanes} delivered no row in this finite pass (every sample "
                               f"filtered or skipped?), so the padding of its last steps (drop_last=False) has no "
                               f"shape to copy; use fewer canonical_replicas")
        return meta, collate([padding_row(row)] * m)

    def _count_dropped(self, rows: int) -> None:
        self.dropped_rows += rows

    def _count_uneven_tail(self, rows: int) -> None:
        """drop_last=False under torch.distributed: the ranks stopped at the first step some rank had no
        row of. Rows this rank still held are counted and reported, not silently lost."""
        self.dropped_rows += rows
        if rows:
            w = self.words
            warn_once(("uneven_tail", self.plan.fingerprint, w["host"]),
                      "%s: a finite pass (%s) with %s: another rank ran out of rows before this one, so every rank "
                      "stopped at the same step (a collective would hang otherwise); %d rows of this rank were not "
                      "delivered (counted in %s; logged once per process). %s ends every rank at its first "
                      "incomplete step by design", w["host"], w["finite"], w["drop_last"].format(False), rows,
                      w["dropped"], w["drop_last"].format(True))

    def consumed(self, items) -> None:
        """Record the lane entries of ``(meta, payload)`` items now handed to the training loop."""
        for meta, _ in items:
            if meta.get("last"):
                self.progress.record(meta["state"])

    def ordered_groups(self, items, build=None):
        """``groups(items)``, each recorded as consumed once it is handed out: yields ``build(group)`` (the
        group itself without ``build``). ``build`` (an adapter's conversion to the host's batch) runs before
        the group counts, so an exception in it, or anywhere before the training loop has the result, loses
        nothing: the rank's checkpoint then still holds the group (``Progress.handed``)."""
        P = self.progress
        for group in self.groups(items):
            out = group if build is None else build(group)
            entries = [meta["state"] for meta, _ in group if meta.get("last")]
            P.handed = entries
            yield out
            P.commit()

    def ordered_items(self, items, build=None):
        """``groups(items)`` flattened to single ``(meta, payload)`` items (``build(item)`` of each, with
        ``build``), each recorded as consumed once it is handed out; items that only carry a state (``skip``)
        are recorded and not handed out."""
        P = self.progress
        # an endless stream hands each item out as soon as it is in order: the first one needs one lane's work
        for group in self.groups(items, stream=not (self.plan.finite and self._agree_end)):
            for item in group:
                if item[0].get("skip"):
                    self.consumed([item])
                    continue
                out = item if build is None else build(item)
                entries = [item[0]["state"]] if item[0].get("last") else []
                P.handed = entries
                yield out
                P.commit()

    def explain(self, steps, state=None, text_field: str | None = None) -> dict:
        """Every row of the global batches of ``steps`` under this rank's config and skipped steps (``rank`` is
        the dp rank delivering it): ``engine.explain.explain``, which documents the arguments and the result."""
        return explain(self.plan, steps, state=state, text_field=text_field)

    # -- state --------------------------------------------------------------------------------------
    def initial_state(self) -> dict:
        """This rank's checkpoint before anything was delivered."""
        return initial_state(self.plan)

    def start_state(self) -> dict:
        """The rank's checkpoint the next worker iteration starts from (set by ``load`` and ``begin``)."""
        return self._start

    def start_cursors(self) -> list:
        """``start_state``'s lanes as ``LaneCursor``s, in lane order."""
        return [ckpt.LaneCursor.from_dict(e) for e in self._start["lanes"]]

    def rank_state(self) -> dict:
        """This rank's checkpoint as of the last item handed out: JSON data."""
        return self.progress.checkpoint()

    def lane_entries(self) -> list[dict]:
        """``rank_state()["lanes"]``, cheaply (``Progress.lane_entries``): what a host publishes every step."""
        return self.progress.lane_entries()

    def saved_rank_state(self) -> dict:
        """``rank_state()`` with the topology it was saved at (``ranks.rank_checkpoint``): a host's per-rank
        ``state_dict``, restorable here or, through ``SavedRanks``, at another dp degree. No collective."""
        L = self.plan
        return rank_checkpoint(self.rank_state(), L.dp_degree, L.dp_rank, L.lane_assignment)

    def global_state(self, **gather_kwargs) -> dict:
        """Every rank's state merged (``checkpoint.gather_checkpoint``: a collective when torch.distributed
        is initialised; ``aggregate_dir`` / ``run_id`` / ``timeout`` otherwise)."""
        return ckpt.gather_checkpoint(self.rank_state(), **gather_kwargs)

    def state(self) -> dict:
        """Merged over ranks when a process group of more than one rank is up (a collective), else the rank's."""
        dist = _dist()
        if dist is not None and dist.get_world_size() > 1:
            return self.global_state()
        return self.rank_state()

    def restart(self) -> None:
        """After a finite pass ended: start the next one from its beginning. A quota pass (Energon's fractional
        ``repetitions``) goes on to the next quota period, each dataset continuing its shuffled passes; any other
        finite pass starts over."""
        if self.plan.source.quota is not None:
            self.plan = self.progress.plan = self.plan.with_period(self.plan.source.period + 1)
        self.load(None)

    def load(self, state, worker: tuple[int, int] | None = None) -> None:
        """Continue from ``state``: a rank's or merged checkpoint, a list of rank checkpoints (merged here;
        they must hold this rank's lanes), this rank's ``save_rank_state`` entry, a ``SavedRanks`` (only the
        entries holding this rank's lanes are read), or None (the start). Validated now: ``CheckpointError`` says what
        differs or which lanes are missing.

        worker: ``(num_workers, worker_id)`` when a host restores each worker process from that worker's own
        state (torchdata's per-worker protocol): only the worker's lanes (``worker_lanes``) must be there, and
        only they are restored (that process iterates nothing else)."""
        state = restorable(state, self.plan)  # a SavedRanks: only the entries holding this rank's lanes are read
        state = self.initial_state() if state is None else ckpt.merge_rank_states(state)
        period = ((state.get("config") or {}).get("work") or {}).get("period", 0)
        if self.plan.source.quota is not None and period != self.plan.source.period:  # a later quota pass's state
            self.plan = self.progress.plan = self.plan.with_period(period)
        lanes = self.plan.rank_lanes if worker is None or worker[0] == 0 else \
            worker_lanes(self.plan.rank_lanes, *worker)
        plan = self.plan.with_restored_skips(state)  # the checkpoint's skipped steps (checkpoint.skip_in_state)
        by_lane = plan.validate(state, lanes)
        self.plan = self.progress.plan = plan
        self._start = plan.make_state([by_lane[lane] for lane in lanes])
        self.progress.reset(self._start)
        self.dropped_rows = 0
        self._template = None
