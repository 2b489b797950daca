"""A small side channel between a host loader's main process and its worker processes, on the local filesystem.

With worker processes, the dataset object in the main process never sees the samples, yet some hosts ask *it* for
the state (Mosaic Composer: ``dataset.state_dict(num_samples, from_beginning)``). So the process that yields a step
publishes the rank's lane entries (``Loader(emit_state=True)``'s ``__state__``) once that step is handed out, and the
main process reads the entries of the step the host names. The channel also records which ``__iter__`` call got
which pass (a *claim*), and a state loaded into the main process until the next ``__iter__`` takes it (exactly
once), so every worker of one iteration agrees on both, persistent or not.

Files: ``owner.json`` (the process that made the directory, ``private_dir``), ``claims.json`` (the claim table,
updated under ``flock``), ``current.json`` (the claim a main process made
for its workers), ``e<pass>/s<step>.json`` (the rank's lane entries after a step). Every write is atomic
(``formats.fileio.atomic_write``). Nothing here decides order: it carries checkpoint entries the core produced.
"""
from __future__ import annotations

import fcntl
import json
import os
import shutil
import tempfile
import time
from contextlib import contextmanager

from ..formats.fileio import atomic_write, pid_alive

#: Claims kept in the table (older iterations are never asked for again).
KEEP_ITERATIONS = 16
#: A tmpfs is used for private directories only when it has this much room (the exchange of
#: ``host.exchange`` holds up to a prefetch window of micro-batches there).
MIN_TMPFS_FREE = 1 << 30


def private_dir(prefix: str, base: str | None = None) -> str:
    """Create a directory private to this process and the workers it starts; returns its path.

    prefix: the directory name's start. base: where to create it; None: ``/dev/shm`` when it exists, is
    writable and has ``MIN_TMPFS_FREE`` bytes free (files there never touch a disk), else the system temp dir.
    The directory records its owner (``owner.json``: pid and pid namespace); making one first removes the
    directories of ``prefix`` left by owners that are gone (a training process killed with SIGKILL or SIGTERM
    runs no cleanup). Raises OSError when the directory cannot be created."""
    if base is None and os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK):
        try:
            st = os.statvfs("/dev/shm")
            if st.f_bavail * st.f_frsize >= MIN_TMPFS_FREE:
                base = "/dev/shm"
        except OSError:  # no statvfs (not POSIX) or an unusual mount: the temp dir is always right
            pass
    base = base or tempfile.gettempdir()
    sweep_orphans(base, prefix)
    d = tempfile.mkdtemp(prefix=prefix, dir=base)
    write_json(os.path.join(d, "owner.json"), {"pid": os.getpid(), "pid_ns": _pid_namespace()})
    return d


def _pid_namespace():
    """This process's pid namespace (an inode number), or None without procfs: a pid means a process only in it."""
    try:
        return os.stat("/proc/self/ns/pid").st_ino
    except OSError:
        return None


def sweep_orphans(base: str, prefix: str) -> None:
    """Remove the ``private_dir`` directories of ``prefix`` in ``base`` whose owner process is gone. A directory
    without an owner record (being made, or by an older version) or owned in another pid namespace (another
    container sharing ``/dev/shm``: its pids mean nothing here) is left alone."""
    ns = _pid_namespace()
    try:
        names = [n for n in os.listdir(base) if n.startswith(prefix)]
    except OSError:
        return
    for name in names:
        d = os.path.join(base, name)
        try:
            owner = read_json(os.path.join(d, "owner.json"))
            pid = int(owner["pid"])
        except (OSError, ValueError, KeyError, TypeError):
            continue
        if ns is not None and owner.get("pid_ns") == ns and not pid_alive(pid):
            shutil.rmtree(d, ignore_errors=True)


def write_json(path: str, obj) -> None:
    """Replace ``path`` with ``obj`` as compact JSON, atomically (not fsynced: a private, rebuilt-per-run dir)."""
    atomic_write(path, json.dumps(obj, separators=(",", ":")), durable=False)


def read_json(path: str):
    """The JSON value in ``path``. Raises FileNotFoundError / ValueError."""
    with open(path) as f:
        return json.load(f)


class Channel:
    """The side channel of one dataset object.

    Args:
        root: a directory private to one dataset object and the worker processes it starts (``private_dir``).
        keep_steps: published steps kept per pass (older ones are deleted as new ones arrive).
    Picklable: workers get the channel without the main process's in-memory entries."""

    def __init__(self, root: str, keep_steps: int = 256):
        self.root = root
        self.keep_steps = keep_steps
        self._mem: dict[tuple, list] = {}  # entries published by this process itself (no file needed)
        os.makedirs(root, exist_ok=True)

    def __getstate__(self):
        return {k: v for k, v in self.__dict__.items() if k != "_mem"} | {"_mem": {}}

    # -- claims: which __iter__ call runs which pass, from which state ---------------------------
    @contextmanager
    def _locked(self):
        with open(os.path.join(self.root, "lock"), "a+") as f:
            fcntl.flock(f, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(f, fcntl.LOCK_UN)

    def _table(self) -> dict:
        p = os.path.join(self.root, "claims.json")
        if os.path.exists(p):
            return read_json(p)
        return {"next_epoch": 0, "iterations": {}, "order": [], "pending": None}

    def _save(self, t: dict) -> None:
        write_json(os.path.join(self.root, "claims.json"), t)

    def claim(self, key: str, make) -> dict:
        """The claim of iteration ``key``.

        key: names one host iteration (the same in every worker of it). make: ``make(table) -> {"epoch", "start",
        "k0"}``, called by the first caller only (it may consume ``table["pending"]``); later callers with the same
        key get the same claim. Returns the claim dict."""
        with self._locked():
            t = self._table()
            c = t["iterations"].get(key)
            if c is None:
                c = make(t)
                t["iterations"][key] = c
                t["order"].append(key)
                t["next_epoch"] = c["epoch"] + 1
                for old in t["order"][:-KEEP_ITERATIONS]:
                    t["iterations"].pop(old, None)
                t["order"] = t["order"][-KEEP_ITERATIONS:]
                self._save(t)
            return c

    def latest(self) -> tuple[dict | None, dict]:
        """(the newest claim or None, the whole claim table)."""
        with self._locked():
            t = self._table()
        c = t["iterations"].get(t["order"][-1]) if t["order"] else None
        return c, t

    def set_pending(self, state) -> None:
        """Keep ``state`` (JSON data) for the next claim to take."""
        with self._locked():
            t = self._table()
            t["pending"] = state
            self._save(t)

    def set_current(self, claim: dict) -> None:
        """The claim a main process made for its workers (persistent or not), read with ``current()``."""
        write_json(os.path.join(self.root, "current.json"), claim)

    def current(self) -> dict:
        """The claim last given to ``set_current``. Raises FileNotFoundError if there is none."""
        return read_json(os.path.join(self.root, "current.json"))

    # -- per-step lane entries -------------------------------------------------------------------
    def _step_path(self, epoch: int, step: int) -> str:
        return os.path.join(self.root, f"e{epoch}", f"s{step}.json")

    def publish(self, epoch: int, step: int, entries: list, in_memory: bool = False) -> None:
        """Record the rank's lane entries once global step ``step`` (0-based) of pass ``epoch`` was handed out.

        entries: the lane entries (JSON data). in_memory: the publisher is the process that will read them (a main
        process iterating itself): keep the last ``keep_steps`` in memory instead of writing a file per step."""
        if in_memory:
            self._mem[(epoch, step)] = entries
            self._mem.pop((epoch, step - self.keep_steps), None)
            if step == 0:
                for key in [k for k in self._mem if k[0] < epoch - 1]:
                    del self._mem[key]
            return
        d = os.path.join(self.root, f"e{epoch}")
        os.makedirs(d, exist_ok=True)
        write_json(self._step_path(epoch, step), entries)
        old = step - self.keep_steps
        if old >= 0:
            try:
                os.unlink(self._step_path(epoch, old))
            except FileNotFoundError:
                pass
        if step == 0 and epoch >= 2:  # passes before the previous one are never asked for again
            shutil.rmtree(os.path.join(self.root, f"e{epoch - 2}"), ignore_errors=True)

    def has_step(self, epoch: int, step: int) -> bool:
        """Whether the entries of ``step`` of ``epoch`` were published (it was handed out)."""
        return (epoch, step) in self._mem or os.path.exists(self._step_path(epoch, step))

    def entries(self, epoch: int, step: int, timeout: float) -> list:
        """The entries published for ``step`` of ``epoch``.

        timeout: seconds to wait for a worker still writing them. Raises LookupError naming the step, the pass
        and the steps this channel holds when they do not appear in time."""
        if (epoch, step) in self._mem:
            return self._mem[(epoch, step)]
        p = self._step_path(epoch, step)
        deadline = time.monotonic() + timeout
        while True:
            try:
                return read_json(p)
            except FileNotFoundError:
                if time.monotonic() >= deadline:
                    d = os.path.join(self.root, f"e{epoch}")
                    have = sorted(int(n[1:-5]) for n in os.listdir(d) if n.startswith("s")) if os.path.isdir(d) else []
                    span = f"steps {have[0]}..{have[-1]}" if have else "no steps"
                    raise LookupError(f"no lane entries for global step {step} of epoch {epoch} in {d} (this rank "
                                      f"has {span} of that epoch; only the last {self.keep_steps} are kept)") from None
                time.sleep(0.01)
