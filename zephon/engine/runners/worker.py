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
    stage, use_shm, threshold = _setup(sock)
    tasks: queue.SimpleQueue = queue.SimpleQueue()
    threading.Thread(target=_read_tasks, args=(sock, tasks), daemon=True, name="zephon-task-reader").start()
    while True:
        item = tasks.get()
        if item is None:
            break
        _serve(sock, stage, item, threshold if use_shm else None)
    sock.close()
    os._exit(0)


def _setup(sock):
    """Receive and load the stage: ``(stage, use shared memory, threshold)``. A failure is reported to the
    parent (an unguarded main script as such, so the parent names the fix) and ends the worker."""
    try:
        prep, stage_bytes, threshold = recv_msg(sock)
        _prepare(prep)
        stage = pickle.loads(stage_bytes)
        from .. import shm
        return stage, threshold is not None and shm.available(), threshold
    except (EOFError, OSError):
        os._exit(0)
    except BaseException as e:  # noqa: BLE001 (reported to the parent, which raises it)
        unguarded = isinstance(e, UnguardedMainError)  # the parent raises it as such, naming the fix
        try:
            send_msg(sock, ("fatal", os.getpid(), str(e), "unguarded") if unguarded else
                     ("fatal", os.getpid(), f"{type(e).__name__}: {e}\n{traceback.format_exc()}"))
        except OSError:
            pass  # the parent is gone or already stopped the pool (another worker's report)
        os._exit(1)


def _serve(sock, stage, item, threshold) -> None:
    """Run one task ``item`` (``(tid, pointers)``) and send its result (records as columns, ``engine.columns``;
    arrays in shared memory past ``threshold`` bytes, None: pickled only). Ends the worker when the parent is gone."""
    from .. import columns, shm
    tid, ptrs = item
    fd_out = None
    try:
        res = stage.run(ptrs)
        res.records = columns.encode(res.records)  # one array per field, not one pickle per record
        size = 0
        if threshold is not None:
            res.records, fd_out, size = shm.pack(res.records, threshold)
        data = pickle.dumps(("ok", tid, res, size, fd_out is not None), protocol=pickle.HIGHEST_PROTOCOL)
    except BaseException as e:  # noqa: BLE001 (a bug in an operator: the parent raises it in order)
        if fd_out is not None:
            os.close(fd_out)
        data, fd_out = pickle.dumps(("err", tid, _picklable(e), traceback.format_exc())), None
    try:
        send_bytes(sock, data)
        if fd_out is not None:
            shm.send_fd(sock, fd_out)
    except OSError:  # the parent is gone
        os._exit(0)
    finally:
        if fd_out is not None:
            os.close(fd_out)
