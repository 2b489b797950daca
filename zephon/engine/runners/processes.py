"""The ``processes`` runner: a pool of worker processes that die with their parent, are replaced when
they die, and hand large arrays over in shared memory.

One manager thread owns the pool: it starts the workers (so Linux's parent-death signal is tied to a
thread that lives as long as the runner), sends each worker at most ``prefetch`` units over its own
Unix socket, receives results, and watches for deaths. A unit is a pure function of its pointers, so
the units a dead worker held are re-run on a replacement and give the same records; the pump
releases results by sequence number, so nothing is lost or repeated. After ``max_restarts`` deaths
in a row without a finished unit, or when one unit has lost ``max_restarts`` workers, every pending
unit fails with ``WorkerDied`` naming the worker (pid, signal) and the unit (dataset, shard, sample).
"""
from __future__ import annotations

import contextlib
import logging
import os
import pickle
import selectors
import signal
import socket
import subprocess
import sys
import threading
from collections import deque
from concurrent.futures import Future, InvalidStateError
from dataclasses import dataclass, field
from multiprocessing import process as mp_process
from pathlib import Path

from .. import columns, shm
from .base import Runner
from .guard import UnguardedMainError, check_main_guarded
from .worker import recv_msg, send_msg

log = logging.getLogger("zephon")

_WORKER_CMD = "from zephon.engine.runners.worker import main; main()"


class WorkerDied(RuntimeError):
    """A worker process of the ``processes`` runner died and could not be replaced (restarts exhausted)."""


@dataclass
class _Task:
    tid: int
    ptrs: object
    future: Future
    attempts: int = 0  # workers lost while holding it


@dataclass
class _Worker:
    proc: subprocess.Popen
    sock: socket.socket
    outstanding: list = field(default_factory=list)  # task ids sent, in order

    @property
    def pid(self) -> int:
        return self.proc.pid


def _preparation_data() -> dict:
    """What a spawned worker needs to unpickle the stage as ``multiprocessing``'s spawn would (sys.path,
    argv, working directory, the main module), without fixing the parent's start method."""
    orig = mp_process.ORIGINAL_DIR
    d = {"sys_path": [orig if p == "" else p for p in sys.path], "sys_argv": list(sys.argv),
         "dir": os.getcwd(), "orig_dir": orig}
    main = sys.modules.get("__main__")
    name = getattr(getattr(main, "__spec__", None), "name", None)
    if name is not None:
        d["init_main_from_name"] = name
    elif getattr(main, "__file__", None):
        d["init_main_from_path"] = os.path.normpath(os.path.join(orig or "", main.__file__))
    return d


def _exit_text(rc) -> str:
    if rc is None:
        return "stopped answering"
    if rc < 0:
        try:
            return f"was killed by {signal.Signals(-rc).name}"
        except ValueError:
            return f"was killed by signal {-rc}"
    return f"exited with code {rc}"


def describe_unit(stage, ptrs) -> str:
    """The first pointer of a unit as ``dataset 'name' shard s (path) sample i`` (best effort)."""
    try:
        d, s, i = int(ptrs.dataset_ids[0]), int(ptrs.shard_ids[0]), int(ptrs.sample_idx[0])
        ds = stage.datasets[d]
        return f"dataset {ds.name!r} shard {s} ({ds.shards[s].path}) sample {i}, {len(ptrs)} pointers"
    except Exception:  # noqa: BLE001 (a description must never raise)
        return f"{len(ptrs) if hasattr(ptrs, '__len__') else '?'} pointers"


class ProcessRunner(Runner):
    """Worker processes, each given the stage once at start. Units travel as numpy pointer arrays;
    results as pickles of their records' columns (``engine.columns``), with arrays of ``shm_threshold`` bytes or
    more in shared memory (``engine.shm``).

    stage: the ``WorkStage`` (picklable: operators' functions must be module-level).
    num_workers: worker processes (>= 1).
    max_restarts: worker deaths tolerated in a row without a finished unit (and per unit) before
        ``WorkerDied`` is raised; each death starts a replacement and re-runs the dead worker's units.
    shm_threshold: smallest array (bytes) sent through shared memory; None: pickle everything.
    prefetch: units queued per worker.
    Raises ``pickle.PicklingError`` / ``AttributeError`` / ``TypeError`` here when the stage cannot be
    pickled, ``OSError`` when no worker can be started.
    """

    name = "processes"

    def __init__(self, stage, num_workers: int = 2, *, max_restarts: int = 3,
                 shm_threshold: int | None = shm.DEFAULT_THRESHOLD, prefetch: int = 2):
        check_main_guarded()  # an unguarded script would run again in every worker: refuse, naming the fix
        super().__init__(stage, max(1, num_workers))
        self.capacity = 2 * self.num_workers
        self.max_restarts = max_restarts
        self.shm_threshold = shm_threshold if shm.available() else None
        self.prefetch = max(1, prefetch)
        self.restarts = 0                 # replacements started so far
        self.deaths: list[tuple] = []     # (pid, return code, units it held) of every dead worker
        try:
            self._stage_bytes = pickle.dumps(stage, protocol=pickle.HIGHEST_PROTOCOL)
        except (pickle.PicklingError, AttributeError, TypeError) as e:
            ops = ", ".join(getattr(op, "name", type(op).__name__) for op in getattr(stage, "ops", []))
            raise type(e)(f"runner='processes' sends the pipeline to each worker process, so every operator's "
                          f"function must be importable there (a module-level def, not a lambda, closure or "
                          f"method of a local object); operators on workers: {ops or '?'}; pickle said: {e}") from e
        self._prep = _preparation_data()
        # Reentrant: close() may run from a finalizer (a garbage collection) on the manager thread holding it.
        self._lock = threading.RLock()
        self._tasks: dict[int, _Task] = {}
        self._backlog: deque = deque()
        self._workers: list[_Worker] = []
        self._next_tid = 0
        self._in_a_row = 0
        self._broken: BaseException | None = None
        self._closing = False
        self._owner = os.getpid()
        self._sel = selectors.DefaultSelector()
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._wake_w.setblocking(False)
        self._sel.register(self._wake_r, selectors.EVENT_READ, None)
        self._ready = threading.Event()
        self._start_error: BaseException | None = None
        self._thread = threading.Thread(target=self._manage, daemon=True, name="zephon-process-runner")
        self._thread.start()
        self._ready.wait()
        if self._start_error is not None:
            self._thread.join()
            raise self._start_error

    @property
    def pids(self) -> list[int]:
        """Process ids of the live workers."""
        with self._lock:
            return [w.pid for w in self._workers]

    # -- caller side ------------------------------------------------------------------------------
    def submit(self, ptrs) -> Future:
        """Queue one unit; its ``Future`` gets the ``UnitResult`` (or ``WorkerDied``, or the exception
        an operator raised). Raises ``RuntimeError`` after ``close()`` or in a forked copy."""
        if os.getpid() != self._owner:
            raise RuntimeError(f"this processes runner belongs to pid {self._owner}; a forked process must build "
                               "its own (make_runner or a Loader with runner='processes')")
        f: Future = Future()
        with self._lock:
            if self._closing:
                raise RuntimeError("the processes runner is closed")
            if self._broken is not None:
                f.set_exception(self._broken)
                return f
            tid = self._next_tid
            self._next_tid += 1
            self._tasks[tid] = _Task(tid, ptrs, f)
            self._backlog.append(tid)
        self._wake()
        return f

    def close(self, wait: bool = True) -> None:
        """Stop the workers (at once: their socket closes) and cancel units not finished (``wait``: unused)."""
        with self._lock:
            self._closing = True
        self._wake()
        if threading.current_thread() is not self._thread:  # a second close() (another thread's) waits too
            self._thread.join()

    def _wake(self) -> None:
        try:
            self._wake_w.send(b"x")
        except (BlockingIOError, OSError):
            pass

    # -- manager thread ---------------------------------------------------------------------------
    def _spawn(self) -> _Worker:
        parent, child = socket.socketpair()
        env = dict(os.environ)
        root = str(Path(__file__).resolve().parents[3])  # the directory holding the zephon package
        env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
        env.setdefault("TOKENIZERS_PARALLELISM", "false")  # one process per core already
        cmd = [sys.executable, *subprocess._args_from_interpreter_flags(), "-c", _WORKER_CMD,
               str(child.fileno()), str(os.getpid())]
        try:
            proc = subprocess.Popen(cmd, pass_fds=[child.fileno()], env=env, stdin=subprocess.DEVNULL)
        except BaseException:
            parent.close()
            raise
        finally:
            child.close()
        w = _Worker(proc, parent)
        self._sel.register(parent, selectors.EVENT_READ, w)
        return w

    def _init(self, w: _Worker) -> None:
        try:
            send_msg(w.sock, (self._prep, self._stage_bytes, self.shm_threshold))
        except OSError:
            pass  # it died at start (its stderr says why): its socket reports the death, counted as one

    def _manage(self) -> None:
        if not self._start_workers():
            return
        try:
            while True:
                with self._lock:
                    if self._closing or self._broken is not None:
                        break
                self._assign()
                self._dispatch_events()
                for w in list(self._workers):  # a death the socket did not report (its end inherited)
                    if w.proc.poll() is not None:
                        self._on_death(w)
        except BaseException as e:  # noqa: BLE001 (never leave the pump waiting on a future)
            self._fail_all(RuntimeError(f"the processes runner's manager thread failed: {type(e).__name__}: {e}"))
        finally:
            self._shutdown()

    def _start_workers(self) -> bool:
        """Spawn and initialise the workers, then release the constructor; False (the error kept) if that failed."""
        try:
            for _ in range(self.num_workers):
                w = self._spawn()
                with self._lock:
                    self._workers.append(w)
            for w in list(self._workers):
                self._init(w)
        except BaseException as e:  # noqa: BLE001 (re-raised by the constructor)
            self._start_error = e
        self._ready.set()
        if self._start_error is not None:
            self._shutdown()
        return self._start_error is None

    def _dispatch_events(self) -> None:
        """Wait up to 1 s for the wake-up socket (drained) or a worker's message (received)."""
        for key, _ in self._sel.select(timeout=1.0):
            if key.data is None:
                with contextlib.suppress(BlockingIOError):
                    while self._wake_r.recv(4096):
                        pass
            elif key.data in self._workers:
                self._receive(key.data)

    def _assign(self) -> None:
        with self._lock:
            while self._backlog:
                free = [w for w in self._workers if len(w.outstanding) < self.prefetch]
                if not free:
                    return
                w = min(free, key=lambda w: len(w.outstanding))
                task = self._tasks.get(self._backlog.popleft())
                if task is None or task.future.cancelled():
                    continue
                w.outstanding.append(task.tid)
                try:
                    send_msg(w.sock, (task.tid, task.ptrs))
                except OSError:
                    pass  # the worker is dead: its socket reports it and the unit is re-run

    def _receive(self, w: _Worker) -> None:
        try:
            msg = recv_msg(w.sock)
            if msg[0] == "ok":
                _, tid, res, size, has_fd = msg
                res.records = columns.decode(shm.unpack(res.records, shm.recv_fd(w.sock) if has_fd else None, size))
            elif msg[0] == "fatal" and msg[3:] == ("unguarded",):
                self._fail_all(UnguardedMainError(msg[2]))
                return
            elif msg[0] == "fatal":
                self._fail_all(WorkerDied(f"processes runner: worker pid {msg[1]} could not load the pipeline "
                                          f"(datasets and operators): {msg[2]}\nOperators' functions must be "
                                          f"importable in a new process (module-level, not lambdas or closures); "
                                          f"runner='threads' has no such need."))
                return
        except (EOFError, OSError, pickle.UnpicklingError, ConnectionError):
            self._on_death(w)
            return
        tid = msg[1]
        with self._lock:
            task = self._tasks.pop(tid, None)
            if tid in w.outstanding:
                w.outstanding.remove(tid)
            self._in_a_row = 0
        if task is None:
            return
        try:
            if msg[0] == "ok":
                task.future.set_result(res)
            else:
                exc = msg[2]
                exc.add_note(f"(in worker pid {w.pid} of the processes runner, unit "
                             f"{describe_unit(self.stage, task.ptrs)}; worker traceback:\n{msg[3]})")
                task.future.set_exception(exc)
        except InvalidStateError:  # cancelled meanwhile
            pass

    def _on_death(self, w: _Worker) -> None:
        try:
            self._sel.unregister(w.sock)
        except (KeyError, ValueError):
            pass
        w.sock.close()
        try:
            rc = w.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            w.proc.kill()
            rc = w.proc.wait()
        with self._lock:
            if w in self._workers:
                self._workers.remove(w)
            if self._closing:
                return
            self._in_a_row += 1
            lost = [self._tasks[t] for t in w.outstanding if t in self._tasks]
            self.deaths.append((w.pid, rc, len(lost)))
            for t in lost:
                t.attempts += 1
            worst = max((t.attempts for t in lost), default=0)
        what = f"worker pid {w.pid} {_exit_text(rc)} while holding {len(lost)} unit(s)"
        if lost:
            what += f" (first: {describe_unit(self.stage, lost[0].ptrs)})"
        if self._in_a_row > self.max_restarts or worst > self.max_restarts:
            self._fail_all(WorkerDied(
                f"processes runner: {what}; {self._in_a_row} worker deaths in a row without a finished unit, "
                f"{worst} for this unit (max_restarts={self.max_restarts}), so giving up. A unit that kills every "
                f"worker points at its input or at memory (check `dmesg` for the OOM killer); runner='inline' "
                f"shows the failure in this process."))
            return
        new = self._spawn()
        self._init(new)
        with self._lock:
            self._workers.append(new)
            self._backlog.extendleft(t.tid for t in reversed(lost))
            self.restarts += 1
        log.warning("zephon: %s; started worker pid %d and re-running them (restart %d in a row of at most %d)",
                    what, new.pid, self._in_a_row, self.max_restarts)

    def _fail_all(self, err: BaseException) -> None:
        with self._lock:
            if self._broken is None:
                self._broken = err
            tasks = list(self._tasks.values())
            self._tasks.clear()
            self._backlog.clear()
        for t in tasks:
            try:
                t.future.set_exception(err)
            except InvalidStateError:
                pass

    def _shutdown(self) -> None:
        """Close every worker's socket (its reader exits at once), reap them, cancel what is left."""
        with self._lock:
            workers, self._workers = self._workers, []
            tasks = list(self._tasks.values())
            self._tasks.clear()
        for w in workers:
            try:
                self._sel.unregister(w.sock)
            except (KeyError, ValueError):
                pass
            w.sock.close()
        for w in workers:
            try:
                w.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                w.proc.kill()
                w.proc.wait()
        for t in tasks:
            t.future.cancel()
        self._sel.close()
        self._wake_r.close()
        self._wake_w.close()
