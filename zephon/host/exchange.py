"""Whole rank steps from host workers that each compute some of the rank's lanes: the step exchange.

A host that batches inside its worker processes (``torch.utils.data.DataLoader(ds, batch_size=<rank batch>,
num_workers=W)``) collates consecutive samples of ONE worker and asks the workers for batches in turn, so worker
``(k - k0) % W`` must yield the rank's whole step ``k`` (every lane, rank order). Each worker still computes only
its lanes (``worker_lanes``): it publishes its lanes' micro-batches of the steps other workers yield
into a private directory, and collects the other workers' micro-batches of the steps it yields. The files are
pickles: transport between the workers of one host iteration in a private temporary directory, as torch's own
worker queues pickle; never a checkpoint. Each is written atomically and removed by the worker that collects it.

Layout of one iteration's ``directory``: ``s<step>.w<worker>.pkl`` (a worker's items of a step) and
``w<worker>.json`` (its status: ``pid``, ``state``, ``step``, ``error``). States: ``busy`` (computing inside a
host task), ``idle`` (between host tasks: computes nothing until the host asks for more), ``done``, ``left`` (its
iteration was abandoned), ``failed``.

Why no wait is circular. A worker computes only inside the host's tasks, one per step it
yields, and before yielding step ``k`` it computes and publishes its lanes through step ``k + W - 1`` (the step
before its next one); it blocks only in ``collect(k)``. So the lanes of step ``k`` that worker ``v`` computes are
published in ``v``'s task for its last step before ``k`` (or in its first task, when it has none), a task the host
dispatched before task ``k``. With torch's in-order dispatch (round robin, ``prefetch_factor * W >= W`` tasks
ahead) that task is queued whenever task ``k`` is, and only waits itself on steps before ``k``: by induction on
the step every wait ends without the training loop consuming anything more. With ``in_order=False`` a worker may
run out of tasks while the training loop holds batches; its status is then ``idle`` and the timeout, which is for
a worker that computes without publishing, does not run.
"""
from __future__ import annotations

import json
import os
import pickle
import shutil
import time

from ..checkpoint import lane_ranges
from ..formats.fileio import atomic_write, pid_alive
from .workers import worker_lanes

_POLL_MIN, _POLL_MAX = 0.0005, 0.02  # seconds between looks at the directory (doubling while nothing arrives)
ACTIVE = ("busy", "idle")


def start_steps(session) -> dict:
    """``{lane: first step it still owes}`` for a ``RankSession``'s starting state (what worker loaders restore)."""
    rps = session.plan.rows_per_lane_step
    return {c.lane: c.step(rps) for c in session.start_cursors()}


def rank_order(items, lanes) -> list:
    """``(meta, payload)`` items sorted into the rank's order: step, micro-batch index, then ``lanes``' order
    (stable: several items of one lane micro-batch keep theirs)."""
    pos = {lane: i for i, lane in enumerate(lanes)}
    return sorted(items, key=lambda it: (it[0]["step"], it[0]["micro"], pos[it[0]["lane"]]))


def worker_steps(session, num_workers: int, worker_id: int, end_step: int, **item_kwargs):
    """This worker's lanes, cut into steps: yields ``(step, items)`` for every step from the
    session's start to ``end_step`` (exclusive), ``items`` the share's ``(meta, payload)`` of that step (empty for
    a worker without lanes). Never computes past ``end_step``: a step is complete when each of its lanes delivered
    its last micro-batch.

    session: a ``RankSession`` at its starting state. num_workers, worker_id: the host's (0 workers: the whole
    rank). end_step: the first step not to compute. item_kwargs: ``RankSession.worker_items``' keywords
    (``runner``, ``workers``, ``finish``). Raises RuntimeError naming the lanes and step when the stream ends
    before ``end_step``."""
    L = session.plan
    starts = start_steps(session)
    first = min(starts.values())
    mine = L.rank_lanes if num_workers == 0 else worker_lanes(L.rank_lanes, num_workers, worker_id)
    # the rank's last micro-batch of a lane's step: of its block when ranks share the lane (more ranks than lanes)
    last_micro = (L.share_index + 1) * (L.rows_per_rank_step // L.batch.micro_batch_size) - 1
    items = session.worker_items(num_workers, worker_id, **item_kwargs)
    try:
        for k in range(first, end_step):
            due = {lane for lane in mine if starts[lane] <= k}
            bundle = []
            while due:
                try:
                    meta, payload = next(items)
                except StopIteration:
                    raise RuntimeError(f"lanes {lane_ranges(sorted(due))} ended inside step {k}, before step "
                                       f"{end_step} where this pass ends") from None
                if "dropped_rows" in meta:
                    continue
                if meta["step"] != k:  # the core yields a step's micro-batches before the next step's
                    raise RuntimeError(f"internal: lane {meta['lane']} delivered step {meta['step']} while step {k} "
                                       f"of lanes {lane_ranges(sorted(due))} was incomplete")
                bundle.append((meta, payload))
                if meta["last"] and meta["micro"] == last_micro:
                    due.discard(meta["lane"])
            yield k, bundle
    finally:
        items.close()


def exchange_steps(session, directory: str, num_workers: int, worker_id: int, end_step: int, *,
                   timeout: float = 300.0, **item_kwargs):
    """The steps host worker ``worker_id`` of ``num_workers`` yields, each whole, computing only its lanes.

    Yields ``(step, group)`` for steps ``k`` with ``(k - first) % num_workers == worker_id`` (``first``: the
    session's first step), ``group`` the rank's ``(meta, payload)`` items of step ``k`` in rank order, each
    recorded as consumed in ``session`` (so ``session.rank_state()`` is the state after that step). Before yielding
    step ``k`` the worker publishes its lanes through step ``k + num_workers - 1`` (see the module docstring). With
    0 or 1 workers every step is this worker's and nothing touches ``directory``.

    session: a ``RankSession`` at its starting state (every worker of the iteration at the same one).
    directory: private to this host iteration (every worker the same; created if needed).
    end_step: the first step not to yield (every rank's lanes reach it). timeout: seconds to wait for a worker that
    is computing (waits on an idle worker follow the training loop and never time out). item_kwargs:
    ``RankSession.worker_items``' keywords. Raises TimeoutError / RuntimeError naming the worker, step, lanes and
    directory waited for (see ``StepExchange.collect``); OSError when ``directory`` cannot be written."""
    lanes = session.rank_lanes
    first = min(start_steps(session).values())
    W = max(num_workers, 1)
    own = worker_steps(session, num_workers if W > 1 else 0, worker_id, end_step, **item_kwargs)
    if W == 1:
        try:
            for k, items in own:
                group = rank_order(items, lanes)
                session.consumed(group)
                yield k, group
        finally:
            own.close()
        return
    ex = StepExchange(directory, lanes, W, worker_id, first, timeout=timeout)
    held = None  # (step, own items) of this worker's step until it computed every step before its next one
    try:
        ex.mark("busy", first - 1)
        for j, items in own:
            if ex.owner(j) == worker_id:
                held = (j, items)
            elif ex.lanes_of[worker_id]:  # a worker without lanes has nothing to give (nobody waits for it)
                ex.publish(j, items)
            # Yield step k only once steps k + 1 .. k + W - 1 are published: the other workers then find their
            # steps ready, computed in a task that precedes theirs (no wait on this worker's next task).
            if held is not None and (j == held[0] + W - 1 or j == end_step - 1):
                (k, mine), held = held, None
                group = rank_order(mine + ex.collect(k), lanes)
                session.consumed(group)
                ex.mark("idle", j)  # computes nothing until the host asks for more
                yield k, group
                ex.mark("busy", j)
        ex.mark("done", end_step - 1)
    except GeneratorExit:  # the host dropped this iteration (early stop, persistent workers' next pass)
        ex.mark("left")
        raise
    except BaseException as e:
        ex.mark("failed", error=f"{type(e).__name__}: {e}")
        raise
    finally:
        own.close()


class StepExchange:
    """One worker's end of the step exchange of one host iteration.

    Args:
        directory: the iteration's private directory (created if needed).
        lanes: the rank's lanes, in rank order; worker ``v`` computes ``worker_lanes(lanes, num_workers, v)``.
        num_workers, worker_id: the host's worker count (>= 2) and this worker.
        first_step: the iteration's first step; step ``k`` is yielded by worker ``(k - first_step) % num_workers``.
        timeout: seconds ``collect`` waits while the workers it waits for are busy.
    Creating one removes the directories of finished or abandoned iterations beside ``directory``."""

    def __init__(self, directory: str, lanes, num_workers: int, worker_id: int, first_step: int, *,
                 timeout: float = 300.0):
        self.dir, self.W, self.w, self.first_step, self.timeout = directory, num_workers, worker_id, first_step, timeout
        self.lanes_of = {v: worker_lanes(list(lanes), num_workers, v) for v in range(num_workers)}
        self.peers = [v for v in range(num_workers) if v != worker_id and self.lanes_of[v]]
        self._parent = os.getppid()
        os.makedirs(directory, exist_ok=True)
        sweep(os.path.dirname(directory), keep=os.path.basename(directory))

    def owner(self, step: int) -> int:
        """The worker that yields ``step``."""
        return (step - self.first_step) % self.W

    def _path(self, step: int, worker: int) -> str:
        return os.path.join(self.dir, f"s{step}.w{worker}.pkl")

    def mark(self, state: str, step: int | None = None, error: str | None = None) -> None:
        """Publish this worker's status (``ACTIVE`` states must be written; a final one is best effort: the
        directory may be gone when the host tears an iteration down)."""
        try:
            atomic_write(os.path.join(self.dir, f"w{self.w}.json"),
                         json.dumps({"pid": os.getpid(), "state": state, "step": step, "error": error}),
                         durable=False)
        except OSError:
            if state in ACTIVE:
                raise

    def publish(self, step: int, items: list) -> None:
        """Make this worker's ``items`` of ``step`` available to the worker that yields it. Raises OSError naming
        the directory when it cannot be written (e.g. a full tmpfs)."""
        data = pickle.dumps(items, protocol=pickle.HIGHEST_PROTOCOL)
        try:
            atomic_write(self._path(step, self.w), data, durable=False)
        except OSError as e:
            raise OSError(e.errno, f"worker {self.w} cannot publish step {step} ({len(data)} bytes) in {self.dir}: "
                                   f"{e.strerror}; the exchange holds up to a prefetch window of micro-batches") from e

    def _take(self, step: int, worker: int):
        p = self._path(step, worker)
        try:
            with open(p, "rb") as f:
                items = pickle.load(f)
        except FileNotFoundError:
            return None
        os.unlink(p)  # collected: only this worker ever reads it
        return items

    def _status(self, worker: int) -> dict:
        try:
            return _read_json(os.path.join(self.dir, f"w{worker}.json"))
        except FileNotFoundError:
            return {"state": "starting", "pid": None}  # not started yet: counts as busy

    def _what(self, step: int, worker: int, st: dict) -> str:
        pid = f"pid {st['pid']}, " if st.get("pid") else ""
        return (f"worker {worker} ({pid}lanes {lane_ranges(self.lanes_of[worker])}) to publish its micro-batches of "
                f"step {step} in {self.dir}")

    def collect(self, step: int) -> list:
        """The other workers' items of ``step`` (worker order), waiting for them; their files are removed.

        Raises RuntimeError when a worker waited for failed, left the iteration, ended or exited without
        publishing, or when this worker's parent (the host's main process) is gone; TimeoutError after ``timeout``
        seconds during which every worker waited for was busy. Each names the worker, its lanes, the step and the
        directory."""
        missing, got = list(self.peers), {}
        delay, since = _POLL_MIN, time.monotonic()
        while True:
            for v in list(missing):
                items = self._take(step, v)
                if items is not None:
                    got[v] = items
                    missing.remove(v)
            if not missing:
                return [it for v in sorted(got) for it in got[v]]
            states = {v: self._status(v) for v in missing}
            for v, st in states.items():
                if st["state"] in ACTIVE + ("starting",) and not (st["pid"] and not pid_alive(st["pid"])):
                    continue
                items = self._take(step, v)  # it may have published just before its status changed
                if items is None:
                    why = (f"failed ({st.get('error')})" if st["state"] == "failed" else
                           f"is {st['state']}" if st["state"] in ("done", "left") else "exited")
                    raise RuntimeError(f"DataLoader worker {self.w} waited for {self._what(step, v, st)}, but that "
                                       f"worker {why}")
                got[v] = items
                missing.remove(v)
            if not missing:
                return [it for v in sorted(got) for it in got[v]]
            if os.getppid() != self._parent:
                raise RuntimeError(f"DataLoader worker {self.w}: the main process is gone while waiting for step "
                                   f"{step} in {self.dir}")
            now = time.monotonic()
            if any(st["state"] == "idle" for st in states.values()):
                since = now  # waits for the host to send that worker a task: the training loop's pace, not a fault
            elif now - since > self.timeout:
                v = missing[0]
                raise TimeoutError(f"DataLoader worker {self.w} waited {self.timeout:g} s for "
                                   f"{self._what(step, v, states[v])}; it was busy and published nothing (raise the "
                                   f"exchange timeout if a step legitimately takes longer)")
            time.sleep(delay)
            delay = min(max(delay * 2, _POLL_MIN), _POLL_MAX)


def _read_json(path: str):
    with open(path) as f:
        return json.load(f)


def sweep(parent: str, keep: str, min_age: float = 600.0) -> None:
    """Remove the exchange directories under ``parent`` (but ``keep``) whose iteration is over: no status of a
    live worker that is busy or idle. A directory without any status yet is kept for ``min_age`` seconds (its
    workers may be starting)."""
    try:
        names = os.listdir(parent)
    except FileNotFoundError:
        return
    for name in names:
        d = os.path.join(parent, name)
        if name == keep or not os.path.isdir(d):
            continue
        try:
            statuses = [_read_json(os.path.join(d, n)) for n in os.listdir(d) if n.endswith(".json")]
            active = (any(s["state"] in ACTIVE and pid_alive(s["pid"]) for s in statuses) if statuses
                      else time.time() - os.path.getmtime(d) < min_age)
        except (OSError, ValueError, KeyError):  # being written or removed by another worker: leave it
            continue
        if not active:
            shutil.rmtree(d, ignore_errors=True)
