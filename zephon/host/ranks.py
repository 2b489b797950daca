"""Per-rank checkpoints and selective restore: each rank saves only its own lanes (no collective), and a rank
restoring at another dp degree reads only the saved entries that hold the lanes it now owns.

A rank entry is ``save_rank_state(...)``'s dict: the rank's ``Loader.checkpoint()`` (``state``) with the
topology it was saved at (``dp_degree``, ``dp_rank``, ``lane_assignment``). Hosts store entries their own way
(files, DCP keys, a dict) and hand ``load_rank_states`` a ``read_entry(old_rank)`` callable, or a restore a
``SavedRanks`` (the same callable, or a directory of entry files, with the saved dp degree). A merged checkpoint
(``gather_checkpoint``, ``merge_rank_states``) stays an option for small jobs and ``zephon verify``; a host that
keeps one rank's object only (Composer saves rank 0's) gets it from ``gather_rank_states``, a gather to that rank
alone. See docs/distributed.md, "Per-rank checkpoints".
"""
from __future__ import annotations

import json
import os
import re

from ..checkpoint import AggregationError, CheckpointError, canonical_json, merge_states
from ..checkpoint.merge import check_step_spread
from ..checkpoint.torch_dist import decode_payloads, exchange_payloads
from ..work.lanes import check_topology, lane_share, lanes_for_rank
from .agreement import _dist, _vote_group

RANK_FORMAT = "zephon-rank-state/1"


def rank_entries_needed(saved_dp: int, new_dp: int, new_rank: int, canonical_replicas: int, *,
                        saved_assignment: str = "contiguous", new_assignment: str = "contiguous") -> list[int]:
    """The old ranks (ascending) whose entries hold the lanes rank ``new_rank`` of ``new_dp`` owns.

    saved_dp: dp degree the entries were saved at. new_dp / new_rank: the restoring topology.
    canonical_replicas: lanes. saved_assignment / new_assignment: ``"contiguous"`` or ``"interleaved"``.
    Contiguous on both sides: at most ``ceil(saved_dp / new_dp) + 1`` ranks (exactly ``saved_dp / new_dp``
    when it divides); interleaved on both sides: the same when one dp divides the other, else up to one per lane
    the new rank owns (lane ``l`` was on old rank ``l % saved_dp``). When ranks shared a lane at save time
    (``saved_dp`` a multiple of ``canonical_replicas``) the first of them is read: sharing ranks save identical
    entries at a step boundary. Arithmetic only, O(lanes per rank).
    Raises ``TopologyError`` naming the valid dp degrees (``check_topology``)
    for a dp degree that neither divides ``canonical_replicas`` nor is a multiple of it."""
    check_topology(canonical_replicas, saved_dp)
    lanes = lanes_for_rank(canonical_replicas, new_dp, new_rank, new_assignment)
    return sorted({_holder(lane, saved_dp, canonical_replicas, saved_assignment) for lane in lanes})


def _holder(lane: int, dp: int, canonical_replicas: int, assignment: str) -> int:
    """The first rank of ``dp`` whose entry holds ``lane``."""
    if dp > canonical_replicas:  # sharing: ranks [lane*shares, ...) (contiguous) or lane, lane+R, ... hold it
        return lane * (dp // canonical_replicas) if assignment == "contiguous" else lane
    per_rank = canonical_replicas // dp
    return lane // per_rank if assignment == "contiguous" else lane % dp


def save_rank_state(state: dict, dp_degree: int, dp_rank: int, lane_assignment: str = "contiguous") -> dict:
    """This rank's entry of a per-rank checkpoint: ``state`` (its ``Loader.checkpoint()`` or
    ``RankSession`` state, this rank's lanes only) with the topology it was saved at. JSON data, O(lanes per
    rank) bytes; no collective.

    state: a Zephon checkpoint dict (``format`` ``zephon-checkpoint/1``). dp_degree / dp_rank: this rank's
    topology. lane_assignment: the loader's. Raises ``CheckpointError`` for a state that is not a Zephon
    checkpoint, ``TopologyError`` for an impossible topology."""
    if not isinstance(state, dict) or "lanes" not in state:
        raise CheckpointError(f"save_rank_state: not a Zephon checkpoint ({type(state).__name__})")
    lane_share(state["canonical_replicas"], dp_degree, dp_rank, lane_assignment)  # validates the topology
    return {"format": RANK_FORMAT, "dp_degree": dp_degree, "dp_rank": dp_rank, "lane_assignment": lane_assignment,
            "state": state}


def load_rank_states(read_entry, saved_dp: int, new_dp: int, new_rank: int, canonical_replicas: int, *,
                     saved_assignment: str = "contiguous", new_assignment: str = "contiguous",
                     check_entry=None) -> dict:
    """The checkpoint rank ``new_rank`` of ``new_dp`` restores from, read from only the entries it needs.

    read_entry: ``read_entry(old_rank) -> dict``, the entry ``save_rank_state`` made on ``old_rank`` (from a
    file, a DCP key, a dict); called once per rank of ``rank_entries_needed``, never for another.
    saved_dp, new_dp, new_rank, canonical_replicas, saved_assignment, new_assignment: as
    ``rank_entries_needed``. check_entry: like ``read_entry``, called for one more old rank (the next one, when the
    new rank's lanes do not need them all) to check the entries come from one save (``check_step_spread``: a rank's
    file left from an earlier checkpoint); None: no such read. Returns a Zephon checkpoint holding (at least) the
    lanes the new rank owns, for ``Loader.restore`` / ``RankSession(state=...)``. Raises ``CheckpointError``
    naming the old rank whose entry is not a rank entry, was saved at another topology, lacks a lane it should
    hold, conflicts, or lies steps away from another's."""
    old_ranks = rank_entries_needed(saved_dp, new_dp, new_rank, canonical_replicas,
                                    saved_assignment=saved_assignment, new_assignment=new_assignment)
    states = [_checked(read_entry(r), r, saved_dp, saved_assignment) for r in old_ranks]
    names = [f"old rank {r}'s entry" for r in old_ranks]
    merged = merge_states(states, complete=False, names=names)  # checks these entries' steps too
    other = (max(old_ranks) + 1) % saved_dp
    if check_entry is not None and other not in old_ranks:
        check_step_spread(states + [_checked(check_entry(other), other, saved_dp, saved_assignment)],
                          names + [f"old rank {other}'s entry"])
    have = {e["lane"] for e in merged["lanes"]}
    lacking = [lane for lane in lanes_for_rank(canonical_replicas, new_dp, new_rank, new_assignment)
               if lane not in have]
    if lacking:
        raise CheckpointError(f"rank {new_rank} of {new_dp} needs lanes {lacking[:8]} from the entries of old ranks "
                              f"{old_ranks} (saved at dp {saved_dp}), which do not hold them")
    return merged


def rank_checkpoint(state: dict, dp_degree: int, dp_rank: int, lane_assignment: str = "contiguous") -> dict:
    """This rank's checkpoint as a host's per-rank ``state_dict`` (torchdata's ``StatefulDataLoader``): ``state``
    itself (a Zephon checkpoint of this rank's lanes, restorable as before) plus ``saved_at`` (``dp_degree``,
    ``dp_rank``, ``lane_assignment``), so ``SavedRanks`` can check each entry it reads. No collective.

    state: the rank's checkpoint. dp_degree / dp_rank / lane_assignment: its topology. Raises ``CheckpointError``
    for a state that is not a Zephon checkpoint, ``TopologyError`` for an impossible topology."""
    entry = save_rank_state(state, dp_degree, dp_rank, lane_assignment)
    return dict(state, saved_at={k: entry[k] for k in ("dp_degree", "dp_rank", "lane_assignment")})


def _as_entry(entry):
    """``entry`` in ``save_rank_state``'s form: a ``rank_checkpoint`` (a state with ``saved_at``) turned into it;
    anything else as it is."""
    if isinstance(entry, dict) and isinstance(entry.get("saved_at"), dict) and "lanes" in entry:
        return dict(entry["saved_at"], format=RANK_FORMAT, state=entry)
    return entry


def _saved_dp(entry):
    """The dp degree an entry (``save_rank_state``'s or ``rank_checkpoint``'s) says it was saved at, or None."""
    entry = _as_entry(entry)
    return entry.get("dp_degree") if isinstance(entry, dict) else None


def _checked(entry, old_rank: int, saved_dp: int, saved_assignment: str) -> dict:
    """``entry``'s state after checking it is ``old_rank``'s entry of a ``saved_dp`` save (a ``save_rank_state``
    entry, or a ``rank_checkpoint``)."""
    entry = _as_entry(entry)
    if not isinstance(entry, dict) or entry.get("format") != RANK_FORMAT:
        fmt = entry.get("format") if isinstance(entry, dict) else type(entry).__name__
        raise CheckpointError(f"old rank {old_rank}'s entry is not a Zephon rank state (format {fmt!r}, expected "
                              f"{RANK_FORMAT!r})")
    saved = (entry.get("dp_degree"), entry.get("dp_rank"), entry.get("lane_assignment"))
    if saved != (saved_dp, old_rank, saved_assignment):
        raise CheckpointError(f"old rank {old_rank}'s entry was saved as rank {saved[1]} of dp {saved[0]} "
                              f"({saved[2]}), expected rank {old_rank} of dp {saved_dp} ({saved_assignment})")
    return entry["state"]


class SavedRanks:
    """The per-rank entries of one save, read lazily: what a rank restoring at any dp degree is handed
    (``RankSession.load`` and the adapters' ``load_state_dict`` accept it) so it reads only the entries it needs.

    Args:
        read_entry: ``read_entry(old_rank) -> dict``, the entry ``save_rank_state`` made on ``old_rank``.
        saved_dp: the dp degree of the save (entries ``0 .. saved_dp - 1``).
        lane_assignment: the saved loader's (``"contiguous"`` or ``"interleaved"``).
    ``read`` lists the old ranks read so far for their lanes, ``checked`` the one more read to check that the
    entries come from one save (``load_rank_states``' ``check_entry``). ``from_directory`` reads JSON entry files.
    Raises ValueError for a ``saved_dp`` that is not an int >= 1."""

    def __init__(self, read_entry, saved_dp: int, lane_assignment: str = "contiguous"):
        if not isinstance(saved_dp, int) or isinstance(saved_dp, bool) or saved_dp < 1:
            raise ValueError(f"saved_dp must be an int >= 1, got {saved_dp!r}")
        self._read_entry, self.saved_dp, self.lane_assignment = read_entry, saved_dp, lane_assignment
        self.read: list[int] = []
        self.checked: list[int] = []

    @classmethod
    def from_directory(cls, directory, pattern: str = "rank-{rank}.json", lane_assignment: str = "contiguous"):
        """Entries saved one JSON file per rank in ``directory`` (``pattern`` with ``{rank}``). ``saved_dp`` is the
        number of such files (listing the directory reads no entry). Raises ``CheckpointError`` naming the
        directory when it holds none, or naming the missing files when their ranks are not ``0 .. n - 1``."""
        head, _, tail = pattern.partition("{rank}")
        if not _ or "{" in head + tail:
            raise ValueError(f"pattern must hold '{{rank}}' once, got {pattern!r}")
        name = re.compile(re.escape(head) + r"(\d+)" + re.escape(tail) + "$")
        try:
            ranks = sorted(int(m.group(1)) for m in map(name.match, os.listdir(directory)) if m)
        except FileNotFoundError:
            raise CheckpointError(f"no per-rank entries: directory {directory} does not exist") from None
        if not ranks:
            raise CheckpointError(f"no per-rank entries ({pattern}) in {directory}")
        missing = sorted(set(range(ranks[-1] + 1)) - set(ranks))
        if missing or ranks[0] != 0:
            names = [pattern.format(rank=r) for r in missing[:8]]
            raise CheckpointError(f"per-rank entries in {directory} are not ranks 0..{ranks[-1]}: missing {names}")

        def read_file(old_rank: int) -> dict:
            path = os.path.join(directory, pattern.format(rank=old_rank))
            try:
                with open(path) as fh:
                    entry = json.load(fh)
            except ValueError as e:
                raise CheckpointError(f"old rank {old_rank}'s entry {path} is not JSON: {e}") from None
            dp = _saved_dp(entry)
            if isinstance(dp, int) and dp > len(ranks):  # the last ranks' files are gone: the count says less
                names = [pattern.format(rank=r) for r in range(len(ranks), dp)][:8]
                raise CheckpointError(f"{path} was saved at dp {dp}, but {directory} holds {len(ranks)} per-rank "
                                      f"entries ({pattern}): missing {names}")
            return entry
        return cls(read_file, len(ranks), lane_assignment)

    def state_for(self, new_dp: int, new_rank: int, canonical_replicas: int,
                  new_assignment: str = "contiguous") -> dict:
        """``load_rank_states`` over these entries for rank ``new_rank`` of ``new_dp`` (recording ``read`` and
        ``checked``)."""
        def read_entry(old_rank: int) -> dict:
            self.read.append(old_rank)
            return self._read_entry(old_rank)

        def check_entry(old_rank: int) -> dict:
            self.checked.append(old_rank)
            return self._read_entry(old_rank)
        return load_rank_states(read_entry, self.saved_dp, new_dp, new_rank, canonical_replicas,
                                saved_assignment=self.lane_assignment, new_assignment=new_assignment,
                                check_entry=check_entry)


def restorable(obj, plan):
    """What rank ``plan.dp_rank`` of ``plan.dp_degree`` restores from ``obj``: a ``SavedRanks`` read for its lanes
    only; a rank entry (``save_rank_state``) as its state, if it was saved at this topology; anything else (a
    Zephon checkpoint, a list of them, None) as is.

    plan: the restoring rank's ``LoaderPlan``. Raises ``CheckpointError`` for a rank entry of another topology, or a
    ``rank_checkpoint`` of another topology that lacks lanes this rank owns, naming the old ranks this rank needs
    (restore those through ``SavedRanks``)."""
    if isinstance(obj, SavedRanks):
        return obj.state_for(plan.dp_degree, plan.dp_rank, plan.canonical_replicas, plan.lane_assignment)
    if not isinstance(obj, dict):
        return obj
    if obj.get("format") == RANK_FORMAT:
        saved, state = obj, obj.get("state")
    elif isinstance(obj.get("saved_at"), dict) and isinstance(obj.get("lanes"), list):
        saved, state = obj["saved_at"], obj
    else:
        return obj
    here = (plan.dp_degree, plan.dp_rank, plan.lane_assignment)
    at = (saved.get("dp_degree"), saved.get("dp_rank"), saved.get("lane_assignment"))
    if at == here:
        return state
    if state is obj:  # a rank's own state at another topology restores when it holds this rank's lanes (sharing)
        have = {e.get("lane") for e in obj["lanes"] if isinstance(e, dict)}
        if set(lanes_for_rank(plan.canonical_replicas, *here)) <= have:
            return obj
    try:
        need = rank_entries_needed(at[0], plan.dp_degree, plan.dp_rank, plan.canonical_replicas,
                                   saved_assignment=at[2], new_assignment=plan.lane_assignment)
    except Exception:  # noqa: BLE001 - a topology the entry cannot come from: say so below without the list
        need = "?"
    raise CheckpointError(f"this is the state of rank {at[1]} of dp {at[0]} ({at[2]}); this loader is rank "
                          f"{here[1]} of dp {here[0]} ({here[2]}) and needs the states of old ranks {need}: pass "
                          f"zephon.host.SavedRanks(read_entry, saved_dp={at[0]}) (or SavedRanks.from_directory(...)) "
                          f"so it reads only those")


_side_groups: dict = {}  # a gloo group per job group, only for a job on NCCL alone (made on the first gather)


def gather_rank_states(state: dict, *, group=None, root: int = 0, timeout: float = 300.0) -> dict | None:
    """Every rank's ``state`` merged on global rank ``root`` only; None on the other ranks. For a host that keeps
    one rank's object (Composer writes rank 0's): O(ranks) messages into ``root``, none between the others, and
    no rank but ``root`` holds every lane (an all-gather gives each rank all of them).

    state: this rank's checkpoint (its lanes; a replica may give an empty one). group: the torch.distributed
    group (None: the job's). root: the receiving global rank. timeout: seconds ``root`` waits for every rank
    to arrive (gloo's monitored barrier, which names the ranks that did not). A collective: every rank of
    ``group`` calls it, in the same order. It runs on ``group`` when its backend is gloo (or ``cpu:gloo``
    of a mixed one); only a job on NCCL alone gets a gloo side group (``StepAgreement``'s rule), made on the
    first call. Without torch.distributed, or on one rank, it is ``merge_states([state])``.
    Raises ``AggregationError`` naming torch's report when a rank does not arrive or the exchange fails;
    on ``root``, ``CheckpointError`` when the states do not merge (naming the lanes) or one is not JSON."""
    dist = _dist()
    if dist is None or dist.get_world_size(group) <= 1:
        return merge_states([state])
    from datetime import timedelta

    key = (id(group), str(dist.get_backend(group)))
    if key not in _side_groups:
        _side_groups[key] = _vote_group(dist, group)
    pg = _side_groups[key]
    try:
        payload = canonical_json(state).encode()
    except (TypeError, ValueError) as e:
        raise CheckpointError(f"rank {dist.get_rank()}: the state is not JSON data ({e})") from None
    where = f"rank {dist.get_rank()} of {dist.get_world_size(group)}, gathering the data loader state to rank {root}"
    try:
        if str(dist.get_backend(pg)) == "gloo":
            dist.monitored_barrier(pg, timedelta(seconds=timeout), wait_all_ranks=True)
    except Exception as e:  # noqa: BLE001 - torch raises RuntimeError / DistBackendError variants
        raise AggregationError(f"{where}: a rank did not arrive within {timeout:g} s; torch said: "
                               f"{_first_line(e)}", timeout=timeout) from e
    try:
        payloads = exchange_payloads(dist, payload, pg, dst=root)
    except Exception as e:  # noqa: BLE001
        raise AggregationError(f"{where}: the exchange failed after every rank had arrived; torch said: "
                               f"{_first_line(e)}", timeout=timeout) from e
    if payloads is None:
        return None
    return json.loads(canonical_json(merge_states(decode_payloads(payloads))))


def _first_line(e: Exception) -> str:
    text = str(e).strip()
    return text.splitlines()[0] if text else type(e).__name__
