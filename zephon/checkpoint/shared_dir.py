"""Checkpoint aggregation through a shared filesystem, for jobs without a torch.distributed group.

Layout, one directory per aggregation round::

    <aggregate_dir>/<run_id>/<round>/rank-<r>.json   each rank's state (written atomically)
                                     global.json     the merged state (rank 0, once every rank's file exists)
                                     COMMITTED       rank 0's marker, written last: {"seq", "round", digests}
                                     FAILED          rank 0's marker when the states do not merge

A round counts only once ``COMMITTED`` exists, and rank 0 writes it after ``global.json`` is on disk: a rank
that dies mid-checkpoint leaves the previous committed round the latest. Every write is tmp + fsync +
``os.replace`` (+ a directory fsync), so a reader sees a whole file or none. Files hold JSON only.
"""
from __future__ import annotations

import glob
import hashlib
import json
import math
import os
import re
import time

from ..formats.fileio import atomic_write
from .aggregate import AggregationError, Aggregator
from .merge import merge_states
from .schema import CheckpointError, canonical_json

GLOBAL, COMMITTED, FAILED = "global.json", "COMMITTED", "FAILED"
RANK_FORMAT = "zephon-rank-state/1"
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
_ROUND = re.compile(r"^round-(\d+)$")


class DirectoryAggregator(Aggregator):
    """Aggregation over a directory every rank can read and write (NFS, Lustre, a local disk).

    Args:
        aggregate_dir: the shared directory (created if needed).
        run_id: names this run's subdirectory; keep it across restarts so ``latest_checkpoint`` finds
            the rounds of earlier incarnations. Letters, digits, ``._-``.
        world_size: ranks that contribute to every round (>= 1).
        timeout: seconds a rank waits for the others in ``gather`` (> 0).
        poll_interval: seconds between looks at the directory while waiting.
    Construct one per rank and call ``gather`` on every rank in the same order. Default round names
    are ``round-<8 digits>``, counting on from the newest committed ``round-N`` present at construction
    (every rank sees the same one: no round can commit without every rank taking part). On rank 0's
    first ``gather``, the state files of uncommitted rounds (an earlier incarnation that died mid-round)
    are deleted; a rank whose file was deleted that way writes it again.
    Raises ``ValueError`` for a bad ``run_id``, ``world_size``, ``timeout`` or ``poll_interval``.
    """

    def __init__(self, aggregate_dir, run_id: str, world_size: int, timeout: float = 300.0,
                 poll_interval: float = 0.05):
        if not isinstance(run_id, str) or not _NAME.match(run_id):
            raise ValueError(f"run_id must be letters, digits, '.', '_' or '-', got {run_id!r}")
        if not isinstance(world_size, int) or isinstance(world_size, bool) or world_size < 1:
            raise ValueError(f"world_size must be an int >= 1, got {world_size!r}")
        for name, v in (("timeout", timeout), ("poll_interval", poll_interval)):
            if not isinstance(v, (int, float)) or not math.isfinite(v) or v <= 0:
                raise ValueError(f"{name} must be a finite number of seconds > 0, got {v!r}")
        self.aggregate_dir = os.fspath(aggregate_dir)
        self.run_id, self.world_size = run_id, world_size
        self.timeout, self.poll_interval = float(timeout), float(poll_interval)
        self.run_dir = os.path.join(self.aggregate_dir, run_id)
        numbers = [int(m.group(1)) for n in committed_rounds(self.aggregate_dir, run_id) if (m := _ROUND.match(n))]
        self._next_round = max(numbers, default=0) + 1
        self._cleaned = False

    def gather(self, rank: int, state: dict, tag: str | None = None) -> dict:
        """Write this rank's ``state`` (``Loader.checkpoint()``) for the round ``tag`` (default: the next
        ``round-N``), wait for every rank's, and return the merged global state (``merge_states`` in
        rank order); the same dict on every rank. Rank 0 merges and commits ``global.json`` then
        ``COMMITTED``; the other ranks return that committed state once its digest of their own file
        matches what they wrote (an older round of the same name does not count).

        ``tag``: a round name (letters, digits, ``._-``), used once per run; rounds are ordered by
        commit, whatever their names. Blocks up to ``timeout`` seconds. Raises ``AggregationError``
        naming the missing ranks, the round directory and the timeout when a rank's file (or, on the
        others, rank 0's commit) does not appear in time; ``CheckpointError`` if the states do not merge
        (missing or conflicting lanes, other configs: on every rank, rank 0 records it in ``FAILED``),
        for a rank outside ``[0, world_size)`` or a bad tag.
        """
        if not isinstance(rank, int) or not 0 <= rank < self.world_size:
            raise CheckpointError(f"rank {rank!r} outside [0, {self.world_size})")
        name = self._round_name(tag)
        try:
            payload = canonical_json({"format": RANK_FORMAT, "rank": rank, "world_size": self.world_size,
                                      "state": state}).encode()
        except (TypeError, ValueError) as e:
            raise CheckpointError(f"rank {rank}: the state is not JSON data ({e})") from None
        digest = _sha(payload)
        round_dir = os.path.join(self.run_dir, name)
        own = os.path.join(round_dir, f"rank-{rank}.json")
        if rank == 0:
            self._reset_round(round_dir)
        os.makedirs(round_dir, exist_ok=True)
        atomic_write(own, payload)
        deadline = time.monotonic() + self.timeout
        while True:
            if not os.path.exists(own):  # rank 0 cleaned a leftover of an earlier incarnation
                atomic_write(own, payload)
            present = [os.path.exists(os.path.join(round_dir, f"rank-{r}.json")) for r in range(self.world_size)]
            if rank == 0 and all(present):
                return self._merge_and_commit(round_dir, name)
            if rank != 0:
                done = self._committed_for(round_dir, rank, digest)
                if done is not None:
                    return done
            if time.monotonic() >= deadline:
                break
            time.sleep(self.poll_interval)
        raise self._timed_out(name, rank, round_dir, present)

    def _round_name(self, tag: str | None) -> str:
        """The round directory's name: ``tag``, or the next ``round-N`` when None.

        tag: the caller's round name or None. Raises ``CheckpointError`` for a tag that is not a plain name.
        """
        if tag is None:
            name = f"round-{self._next_round:08d}"
            self._next_round += 1
            return name
        if isinstance(tag, str) and _NAME.match(tag):
            return tag
        raise CheckpointError(f"tag must be letters, digits, '.', '_' or '-', got {tag!r}")

    def _reset_round(self, round_dir: str) -> None:
        """Rank 0, before writing its state: clear earlier incarnations' leftovers (once per run) and the
        markers of a re-used round name, which is not committed until done again.

        round_dir: the round's directory (it may not exist yet).
        """
        if not self._cleaned:
            self._clean_uncommitted()
            self._cleaned = True
        for marker in (COMMITTED, FAILED):
            _remove(os.path.join(round_dir, marker))

    def _timed_out(self, name: str, rank: int, round_dir: str, present: list) -> AggregationError:
        """The error of a round that did not complete in time, naming who is missing.

        name: the round. rank: this rank. round_dir: the round's directory. present: per rank, whether its
        state file exists. Returns (not raises) the ``AggregationError``.
        """
        missing = [r for r, p in enumerate(present) if not p]
        if missing:
            what = f"ranks {missing} did not write their state (rank-<r>.json missing)"
        else:
            missing = [0]
            what = f"every rank wrote its state but rank 0 did not commit {GLOBAL} (rank 0 died or stalled)"
        return AggregationError(f"checkpoint aggregation of run {self.run_id!r}, round {name!r}, rank {rank} of "
                                f"{self.world_size}: timed out after {self.timeout:g} s in {round_dir}: {what}; "
                                f"the latest committed round is unchanged", missing, self.timeout, self.run_id)

    # -- rank 0 --------------------------------------------------------------------------------
    def _merge_and_commit(self, round_dir: str, name: str) -> dict:
        paths = [os.path.join(round_dir, f"rank-{r}.json") for r in range(self.world_size)]
        raw = []
        for path in paths:  # every file first: a FAILED marker carries every rank's digest
            with open(path, "rb") as fh:
                raw.append(fh.read())
        states = []
        for r, (path, data) in enumerate(zip(paths, raw)):
            try:
                doc = json.loads(data)
            except ValueError as e:
                self._fail(round_dir, raw, f"{path} is not valid JSON: {e}")
            if not isinstance(doc, dict) or doc.get("format") != RANK_FORMAT or doc.get("rank") != r:
                self._fail(round_dir, raw, f"{path} is not rank {r}'s state file")
            if doc.get("world_size") != self.world_size:
                self._fail(round_dir, raw, f"{path} was written by a job of world_size {doc.get('world_size')}, "
                                           f"this one has {self.world_size}")
            states.append(doc["state"])
        try:
            merged = merge_states(states)
        except CheckpointError as e:
            self._fail(round_dir, raw, str(e))
        data = canonical_json(merged).encode()
        atomic_write(os.path.join(round_dir, GLOBAL), data)
        seq = 1 + max((_read_marker(self.run_dir, n).get("seq", 0)
                       for n in committed_rounds(self.aggregate_dir, self.run_id)), default=0)
        marker = {"seq": seq, "round": name, "run_id": self.run_id, "world_size": self.world_size,
                  "global_sha256": _sha(data), "ranks_sha256": [_sha(d) for d in raw], "time": time.time()}
        atomic_write(os.path.join(round_dir, COMMITTED), canonical_json(marker).encode())
        return json.loads(data)

    def _fail(self, round_dir: str, raw: list, message: str):
        """Record why this round cannot commit (the other ranks raise the same error), then raise."""
        message = f"{message} (run {self.run_id!r}, round directory {round_dir})"
        atomic_write(os.path.join(round_dir, FAILED),
                      canonical_json({"error": message, "ranks_sha256": [_sha(d) for d in raw]}).encode())
        raise CheckpointError(message)

    def _clean_uncommitted(self) -> None:
        """Delete the state files of rounds that never committed: an earlier incarnation's leftovers
        must not be merged with this one's states. Markers stay (FAILED explains a failure; the other
        ranks match markers by digest, so an old one is never taken for a new round)."""
        if not os.path.isdir(self.run_dir):
            return
        for name in os.listdir(self.run_dir):
            d = os.path.join(self.run_dir, name)
            if os.path.isdir(d) and not os.path.exists(os.path.join(d, COMMITTED)):
                for path in glob.glob(os.path.join(d, "rank-*.json")):
                    _remove(path)

    # -- other ranks ---------------------------------------------------------------------------
    def _committed_for(self, round_dir: str, rank: int, digest: str):
        """The committed global state if rank 0 committed this round with this rank's current file;
        raises ``CheckpointError`` if rank 0 recorded a merge failure for it; else None."""
        for marker_name in (COMMITTED, FAILED):
            try:
                with open(os.path.join(round_dir, marker_name), "rb") as fh:
                    marker = json.loads(fh.read())
            except (OSError, ValueError):
                continue
            digests = marker.get("ranks_sha256") or []
            if len(digests) <= rank or digests[rank] != digest:
                continue  # a marker of an older round with this name
            if marker_name == FAILED:
                raise CheckpointError(marker.get("error", "rank 0 could not merge the states"))
            return _read_global(round_dir, marker)
        return None


def committed_rounds(aggregate_dir, run_id: str) -> list[str]:
    """Names of the committed rounds of ``run_id`` in ``aggregate_dir``, oldest first (by commit
    sequence, then name). [] when there are none."""
    run_dir = os.path.join(os.fspath(aggregate_dir), run_id)
    if not os.path.isdir(run_dir):
        return []
    names = [n for n in os.listdir(run_dir) if os.path.isfile(os.path.join(run_dir, n, COMMITTED))]
    return sorted(names, key=lambda n: (_read_marker(run_dir, n).get("seq", 0), n))


def latest_checkpoint(aggregate_dir, run_id: str) -> dict | None:
    """The global state of the newest committed round of ``run_id`` (restorable at any dp_degree), or
    None if no round committed yet. Raises ``CheckpointError`` if its ``global.json`` does not match the
    digest in ``COMMITTED`` (changed or damaged after the commit)."""
    names = committed_rounds(aggregate_dir, run_id)
    if not names:
        return None
    round_dir = os.path.join(os.fspath(aggregate_dir), run_id, names[-1])
    return _read_global(round_dir, _read_marker(os.path.dirname(round_dir), names[-1]))


def _read_global(round_dir: str, marker: dict) -> dict:
    path = os.path.join(round_dir, GLOBAL)
    with open(path, "rb") as fh:
        data = fh.read()
    if _sha(data) != marker.get("global_sha256"):
        raise CheckpointError(f"{path} does not match the digest in its {COMMITTED} marker (changed after the "
                              f"commit?)")
    return json.loads(data)


def _read_marker(run_dir: str, name: str) -> dict:
    try:
        with open(os.path.join(run_dir, name, COMMITTED), "rb") as fh:
            marker = json.loads(fh.read())
        return marker if isinstance(marker, dict) else {}
    except (OSError, ValueError):
        return {}


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _remove(path: str) -> None:
    try:
        os.remove(path)
    except FileNotFoundError:
        pass
