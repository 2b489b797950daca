"""Shared-memory transport of large numpy arrays between a worker process and the pump.

A worker's ``UnitResult`` travels as a pickle, except that every ``numpy.ndarray`` of at least
``threshold`` bytes in its records (at any depth of dicts, lists and tuples) is written into one
anonymous shared-memory file per unit (Linux ``memfd_create``) and replaced by an ``ArrayRef``
(offset, dtype, shape). The file descriptor crosses the worker's Unix socket (``SCM_RIGHTS``); the
pump maps it and the arrays become read-write views of that mapping (no copy on the pump's side).
The file has no name: nothing appears in ``/dev/shm``, nothing needs multiprocessing's resource
tracker, and the memory is freed by the kernel when the last view is dropped, whichever process dies
first. Where ``memfd_create`` is missing (not Linux), ``available()`` is False and results are pickled.
"""
from __future__ import annotations

import mmap
import os
import socket
from dataclasses import dataclass

import numpy as np

DEFAULT_THRESHOLD = 64 * 1024  # bytes; smaller arrays are cheaper to pickle than to map
_ALIGN = 64


@dataclass(frozen=True)
class ArrayRef:
    """Where one array lives in its unit's shared-memory file: byte ``offset``, ``dtype`` (a
    ``numpy.dtype.str``), ``shape``."""
    offset: int
    dtype: str
    shape: tuple


def available() -> bool:
    """Whether anonymous shared memory with descriptor passing is supported here (Linux)."""
    return hasattr(os, "memfd_create") and hasattr(socket, "CMSG_SPACE")


def _eligible(a, threshold: int) -> bool:
    return type(a) is np.ndarray and a.nbytes >= threshold and not a.dtype.hasobject and a.nbytes > 0


def _walk(obj, fn):
    """A copy of ``obj`` with ``fn`` applied to every leaf inside dicts, lists and tuples."""
    if isinstance(obj, dict):
        return {k: _walk(v, fn) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_walk(v, fn) for v in obj]
    if type(obj) is tuple:
        return tuple(_walk(v, fn) for v in obj)
    return fn(obj)


def pack(records: list, threshold: int = DEFAULT_THRESHOLD):
    """Move the large arrays of ``records`` into a new shared-memory file.

    records: a unit's records (dicts; arrays at any depth of dicts, lists and tuples).
    threshold: minimum array size in bytes to move (smaller ones stay in the pickle).
    Returns ``(records, fd, size)``: the records with ``ArrayRef`` in place of the moved arrays, the
    file descriptor (the caller sends it, then closes it) and the file size in bytes; ``(records,
    None, 0)`` when nothing was moved.
    """
    found: list = []

    def collect(v):
        if _eligible(v, threshold):
            found.append(v)
        return v

    _walk(records, collect)
    if not found:
        return records, None, 0
    offsets, size = {}, 0
    for a in found:
        if id(a) not in offsets:
            offsets[id(a)] = size
            size += -(-a.nbytes // _ALIGN) * _ALIGN
    fd = os.memfd_create("zephon-unit", getattr(os, "MFD_CLOEXEC", 0))
    try:
        os.ftruncate(fd, size)
        written = set()
        for a in found:  # write(2) into the file: about twice as fast as faulting in a fresh mapping
            if id(a) not in written:
                written.add(id(a))
                buf, off = np.ascontiguousarray(a).reshape(-1).view(np.uint8), offsets[id(a)]
                while len(buf):
                    n = os.pwrite(fd, buf, off)
                    buf, off = buf[n:], off + n
    except BaseException:
        os.close(fd)
        raise

    def swap(v):
        if _eligible(v, threshold):
            return ArrayRef(offsets[id(v)], v.dtype.str, tuple(v.shape))
        return v

    return _walk(records, swap), fd, size


def unpack(records: list, fd: int | None, size: int) -> list:
    """Replace every ``ArrayRef`` of ``records`` by a view of the shared-memory file ``fd`` (``size``
    bytes), then close ``fd``. The mapping lives as long as any of its arrays (which arrive C-contiguous,
    writable, private to this process). Returns the records."""
    if fd is None:
        return records
    try:
        mm = mmap.mmap(fd, size, flags=mmap.MAP_SHARED | getattr(mmap, "MAP_POPULATE", 0))
    finally:
        os.close(fd)

    def view(v):
        if isinstance(v, ArrayRef):
            return np.ndarray(v.shape, np.dtype(v.dtype), buffer=mm, offset=v.offset)
        return v

    return _walk(records, view)


def send_fd(sock: socket.socket, fd: int) -> None:
    """Send one file descriptor over the Unix stream socket ``sock`` (one byte of payload)."""
    sock.sendmsg([b"F"], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, np.array([fd], np.int32).tobytes())])


def recv_fd(sock: socket.socket) -> int:
    """Receive one file descriptor sent by ``send_fd``. Raises ``EOFError`` when the peer is gone."""
    msg, anc, _flags, _addr = sock.recvmsg(1, socket.CMSG_SPACE(4))
    if not msg:
        raise EOFError("the worker closed its socket before sending its shared-memory descriptor")
    for level, kind, data in anc:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            return int(np.frombuffer(data[:4], np.int32)[0])
    raise OSError("a shared-memory message arrived without its file descriptor")
