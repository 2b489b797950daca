"""The worker process of the ``processes`` runner (started as ``python -c ... main()``).

It exits when its parent dies, by three independent signals: Linux's parent-death signal
(``prctl(PR_SET_PDEATHSIG, SIGKILL)``), end-of-file on its socket to the parent, and a thread that
polls ``os.getppid()``. It uses no multiprocessing machinery (no resource tracker, no semaphores), so
nothing else outlives a killed parent, and it may be started from a daemonic process (a torch
DataLoader worker). Wire format: ``send_msg`` / ``recv_msg`` frames (8-byte length, pickle).
"""
from __future__ import annotations

import ctypes
import os
import pickle
import queue
import signal
import socket
import struct
import sys
import threading
import traceback

from .guard import UnguardedMainError, importing_main

PR_SET_PDEATHSIG = 1
POLL_PARENT_S = 0.5
_HEADER = struct.Struct("!Q")


def send_msg(sock: socket.socket, obj) -> None:
    """Send one pickled frame."""
    send_bytes(sock, pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL))


def send_bytes(sock: socket.socket, data: bytes) -> None:
    """Send one frame of already pickled ``data``."""
    if len(data) < 65536:
        sock.sendall(_HEADER.pack(len(data)) + data)
    else:
        sock.sendall(_HEADER.pack(len(data)))
        sock.sendall(data)


def _recv_exact(sock: socket.socket, n: int) -> bytearray:
    buf = bytearray(n)
    view, got = memoryview(buf), 0
    while got < n:
        k = sock.recv_into(view[got:], n - got)
        if not k:
            raise EOFError(f"socket closed after {got} of {n} bytes")
        got += k
    return buf


def recv_msg(sock: socket.socket):
    """Receive one frame sent by ``send_msg``. Raises ``EOFError`` when the peer has gone."""
    (n,) = _HEADER.unpack(_recv_exact(sock, _HEADER.size))
    return pickle.loads(_recv_exact(sock, n))


def set_parent_death_signal() -> None:
    """Ask Linux to SIGKILL this process when the thread that started it exits (no-op elsewhere)."""
    if not sys.platform.startswith("linux"):
        return
    try:
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)
    except (OSError, AttributeError):
        pass


def _watch_parent(ppid: int) -> None:
    while True:
        if os.getppid() != ppid:
            os._exit(0)
        threading.Event().wait(POLL_PARENT_S)


def _prepare(prep: dict) -> None:
    """What ``multiprocessing.spawn.prepare`` does for unpickling: the parent's sys.path, argv, working
    directory and main module (as ``__mp_main__``, so functions defined in a script unpickle)."""
    from multiprocessing import spawn
    with importing_main(prep.get("init_main_from_path") or prep.get("init_main_from_name") or "__main__"):
        spawn.prepare(prep)


def _picklable(exc: BaseException) -> BaseException:
    try:
        pickle.loads(pickle.dumps(exc))
        return exc
    except Exception:
        return RuntimeError(f"{type(exc).__name__}: {exc}")


def _read_tasks(sock: socket.socket, tasks: queue.SimpleQueue) -> None:
    """Feed tasks to the main thread; the parent's end closing means it died or closed us: exit."""
    while True:
        try:
            item = recv_msg(sock)
        except (EOFError, OSError):
            os._exit(0)
        tasks.put(item)
        if item is None:
            return


def main() -> None:
    """Entry point: ``argv[1]`` the socket's descriptor, ``argv[2]`` the expected parent pid."""
    fd, ppid = int(sys.argv[1]), int(sys.argv[2])
    set_parent_death_signal()
    if os.getppid() != ppid:  # the parent died before the signal was armed
        os._exit(0)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle; it closes us
    threading.Thread(target=_watch_parent, args=(ppid,), daemon=True, name="zephon-parent-watch").start()
    sock = socket.socket(fileno=fd)
    stage, threshold = _receive_stage(sock)
    from .. import shm  # imported by _receive_stage already
    tasks: queue.SimpleQueue = queue.SimpleQueue()
    threading.Thread(target=_read_tasks, args=(sock, tasks), daemon=True, name="zephon-task-reader").start()
    while True:
        item = tasks.get()
        if item is None:
            break
        data, fd_out = _run_unit(stage, *item, threshold)
        try:
            send_bytes(sock, data)
            if fd_out is not None:
                shm.send_fd(sock, fd_out)
        except OSError:  # the parent is gone
            os._exit(0)
        finally:
            if fd_out is not None:
                os.close(fd_out)
    sock.close()
    os._exit(0)


def _receive_stage(sock: socket.socket):
    """Receive and unpickle the stage (after the parent's ``_prepare``); exit when that fails.

    sock: the socket to the parent. Returns ``(stage, shm threshold in bytes, None: no shared memory)``.
    A failure is reported to the parent (``fatal``; ``unguarded`` for an ``UnguardedMainError``, which the
    parent raises as such, naming the fix), then the process exits; a parent already gone: exit quietly.
    """
    try:
        prep, stage_bytes, threshold = recv_msg(sock)
        _prepare(prep)
        stage = pickle.loads(stage_bytes)
        from .. import shm
        use_shm = threshold is not None and shm.available()
    except (EOFError, OSError):
        os._exit(0)
    except BaseException as e:  # noqa: BLE001 (reported to the parent, which raises it)
        unguarded = isinstance(e, UnguardedMainError)
        try:
            send_msg(sock, ("fatal", os.getpid(), str(e), "unguarded") if unguarded else
                     ("fatal", os.getpid(), f"{type(e).__name__}: {e}\n{traceback.format_exc()}"))
        except OSError:
            pass  # the parent is gone or already stopped the pool (another worker's report)
        os._exit(1)
    return stage, threshold if use_shm else None


def _run_unit(stage, tid: int, ptrs, threshold: int | None) -> tuple[bytes, int | None]:
    """Run one unit: ``(the pickled reply, memfd holding its arrays or None)``.

    stage: the ``WorkStage``. tid: the unit's task id. ptrs: its pointers. threshold: smallest array (bytes)
    sent through shared memory; None: pickle everything. An exception (a bug in an operator) becomes an
    ``err`` reply, which the parent raises in order.
    """
    from .. import shm
    fd_out = None
    try:
        res = stage.run(ptrs)
        size = 0
        if threshold is not None:
            res.records, fd_out, size = shm.pack(res.records, threshold)
        return pickle.dumps(("ok", tid, res, size, fd_out is not None), protocol=pickle.HIGHEST_PROTOCOL), fd_out
    except BaseException as e:  # noqa: BLE001 (a bug in an operator: the parent raises it in order)
        if fd_out is not None:
            os.close(fd_out)
        return pickle.dumps(("err", tid, _picklable(e), traceback.format_exc())), None
