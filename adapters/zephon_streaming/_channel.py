"""A small per-dataset side channel on the local filesystem.

The main process's dataset object never sees the samples when a ``torch.utils.data.DataLoader`` runs
workers, yet Composer asks *it* for the state (``state_dict(num_samples, from_beginning)``). So the
processes that run the rank's lanes publish, after every global step, the rank's lane entries
(``engine.Loader`` ``__state__``) to ``<root>/e<epoch>/s<step>.json``; the main process reads the entry
of the step Composer names. The channel also records which ``__iter__`` call got which epoch, and the
state loaded by ``load_state_dict`` until the next ``__iter__`` takes it (exactly once), so workers of
one DataLoader iteration agree on both, persistent or not.

Every write is atomic (temp file + ``os.replace``); the claim table is updated under ``flock``.
Nothing here decides order: it only carries checkpoint entries the core produced.
"""
from __future__ import annotations

import fcntl
import json
import os
import shutil
import tempfile
import time
from contextlib import contextmanager

KEEP_ITERATIONS = 16


def write_json_atomic(path: str, obj) -> None:
    d = os.path.dirname(path)
    fd, tmp = tempfile.mkstemp(dir=d, prefix=".tmp-")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(json.dumps(obj, separators=(",", ":")))  # one C-encoded string: json.dump streams in Python
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def read_json(path: str):
    with open(path) as f:
        return json.load(f)


class Channel:
    """``root``: a directory private to one dataset object and the worker processes it spawns."""

    def __init__(self, root: str, keep_steps: int = 256):
        self.root = root
        self.keep_steps = keep_steps
        self._mem: dict[tuple, list] = {}  # entries published by this process itself (no file needed)
        os.makedirs(root, exist_ok=True)

    def __getstate__(self):  # workers get the channel, not the main process's in-memory entries
        return {k: v for k, v in self.__dict__.items() if k != "_mem"} | {"_mem": {}}

    # -- claims: which __iter__ call runs which epoch, from which state ---------------------------
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
        write_json_atomic(os.path.join(self.root, "claims.json"), t)

    def claim(self, key: str, make) -> dict:
        """The claim of iteration ``key``: the first caller creates it with ``make(table)`` (which
        returns ``{"epoch", "start", "k0"}`` and may consume ``table["pending"]``); later callers with
        the same key (the other workers of that DataLoader iteration) get the same claim."""
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
        """(the newest claim or None, the whole table)."""
        with self._locked():
            t = self._table()
        c = t["iterations"].get(t["order"][-1]) if t["order"] else None
        return c, t

    def set_pending(self, state) -> None:
        with self._locked():
            t = self._table()
            t["pending"] = state
            self._save(t)

    def set_current(self, claim: dict) -> None:
        """For StreamingDataLoader workers (persistent or not): the claim the main process made."""
        write_json_atomic(os.path.join(self.root, "current.json"), claim)

    def current(self) -> dict:
        return read_json(os.path.join(self.root, "current.json"))

    # -- per-step lane entries -------------------------------------------------------------------
    def _step_path(self, epoch: int, step: int) -> str:
        return os.path.join(self.root, f"e{epoch}", f"s{step}.json")

    def publish(self, epoch: int, step: int, entries: list, in_memory: bool = False) -> None:
        """The rank's lane entries once global step ``step`` (0-based) of ``epoch`` is consumed.
        ``in_memory``: the publisher is the process that will read them (StreamingDataLoader's main
        process): keep them in memory (the last ``keep_steps``) instead of writing a file per step."""
        if in_memory:
            self._mem[(epoch, step)] = entries
            self._mem.pop((epoch, step - self.keep_steps), None)
            if step == 0:
                for key in [k for k in self._mem if k[0] < epoch - 1]:
                    del self._mem[key]
            return
        d = os.path.join(self.root, f"e{epoch}")
        os.makedirs(d, exist_ok=True)
        write_json_atomic(self._step_path(epoch, step), entries)
        old = step - self.keep_steps
        if old >= 0:
            try:
                os.unlink(self._step_path(epoch, old))
            except FileNotFoundError:
                pass
        if step == 0 and epoch >= 2:  # epochs before the previous one are never asked for again
            shutil.rmtree(os.path.join(self.root, f"e{epoch - 2}"), ignore_errors=True)

    def has_step(self, epoch: int, step: int) -> bool:
        return (epoch, step) in self._mem or os.path.exists(self._step_path(epoch, step))

    def entries(self, epoch: int, step: int, timeout: float) -> list:
        """The entries published for ``step``; waits up to ``timeout`` s for a worker still writing it."""
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
                    raise LookupError(f"no lane entries for global step {step} of epoch {epoch} (this rank has {span} "
                                      f"of that epoch; only the last {self.keep_steps} are kept)") from None
                time.sleep(0.01)
