"""Mosaic's epochs and Composer's state calls, on Zephon checkpoints.

Composer asks the dataset for ``state_dict(num_samples, from_beginning)`` (global samples of the current epoch) and
gives it back with ``load_state_dict(obj)``, used by the next ``__iter__`` only. This module translates that shape:
a Mosaic-style dict (``epoch``, ``sample_in_epoch``, the config it was made with) around the rank-merged Zephon
checkpoint (``loader``). The lane entries come from the side channel (``zephon.host.Channel``), published by
whichever process handed out each step. Composer saves rank 0's dataset state alone, so under torch.distributed
the ranks' lanes are gathered to rank 0 (``zephon.host.gather_rank_states``); without it they merge through a
shared directory (``zephon.host.gather_checkpoint``).
"""
from __future__ import annotations

import json
import uuid

from zephon.checkpoint import canonical_json
from zephon.host import CheckpointError, gather_checkpoint, gather_rank_states, merge_rank_states

STATE_FORMAT = "zephon-streaming/1"


def _div(a, b):
    return a // b if isinstance(a, int) and a % b == 0 else f"<{a} is not divisible by {b}>"


class MosaicState:
    """``StreamingDataset``'s epochs and state calls (a mixin: it uses the dataset's ``_channel``, config and
    ``_session``)."""

    @property
    def next_epoch(self) -> int:
        """The epoch the next ``__iter__`` runs (unless a loaded state names another)."""
        return self._channel.latest()[1]["next_epoch"]

    # -- claims: which __iter__ runs which epoch, from which state ----------------------------------
    def _make_claim(self, table: dict) -> dict:
        pending = table.get("pending")
        table["pending"] = None
        if pending is None:
            return {"epoch": table["next_epoch"], "start": None, "k0": 0}
        return {"epoch": pending["epoch"], "start": pending["loader"],
                "k0": pending["sample_in_epoch"] // self.global_batch_size}

    def _claim(self, key: str) -> dict:
        return self._channel.claim(key, self._make_claim)

    # -- Composer's calls ---------------------------------------------------------------------------
    def state_dict(self, num_samples: int, from_beginning: bool) -> dict:
        """Composer's call: the state after ``num_samples`` samples of the current epoch.

        num_samples: global samples (all ranks), a whole number of global batches. from_beginning: count them from
        the start of the epoch (False: from where this run resumed). Call it on every rank (Composer does, and saves
        rank 0's result): under torch.distributed rank 0 returns every rank's lanes, the others their own; through
        ``aggregate_dir`` every rank returns every lane. Rank 0's result is restorable at another world size
        (same global batch) and DataLoader ``num_workers``. At ``num_samples`` 0 after an epoch was consumed to its
        end (Composer's end-of-epoch checkpoint) it is the start of the next epoch, so the finished epoch is not
        replayed. Raises ValueError for a count that is not whole steps, past the epoch or before the resume point;
        LookupError when a worker's entries of that step do not arrive within ``state_timeout``."""
        gbs, S = self.global_batch_size, self.steps_per_epoch
        if not isinstance(num_samples, int) or num_samples < 0:
            raise ValueError(f"num_samples must be an int >= 0, got {num_samples!r}")
        claim, table = self._channel.latest()
        if claim is None:  # nothing iterated yet: the loaded state (unused) or the start
            p = table["pending"]
            if p is not None:
                return self._state(p["epoch"], p["sample_in_epoch"], p["loader"])
            return self._state(table["next_epoch"], 0, None)
        e, k0 = claim["epoch"], claim["k0"]
        if num_samples % gbs:
            raise ValueError(f"num_samples={num_samples} is not a whole number of global batches of {gbs} "
                             f"(batch_size {self.batch_size} x {self.dp_degree} ranks): the state is kept per step")
        c = num_samples // gbs + (0 if from_beginning else k0)
        if c == 0 or (c <= k0 and num_samples == 0):
            if self._channel.has_step(e, S - 1):  # the epoch was consumed to its end: Composer's epoch end
                return self._state(e + 1, 0, None)
            if k0 == 0:
                return self._state(e, 0, None)
            return self._state(e, k0 * gbs, claim["start"])
        if c > S:
            raise ValueError(f"num_samples={num_samples} is past the end of the epoch ({S} steps of {gbs} samples)")
        if c < k0:
            raise ValueError(f"num_samples={num_samples} names step {c}, before step {k0} where this run resumed")
        if c == k0:
            return self._state(e, c * gbs, claim["start"])
        entries = self._channel.entries(e, c - 1, self.state_timeout)
        rank_state = self._plan(e).make_state(entries)
        return self._state(e, c * gbs, self._gather(rank_state, e, f"e{e}-s{c}"))

    def _state(self, epoch: int, sample_in_epoch: int, loader_state) -> dict:
        # ``loader`` is the lanes' checkpoint as JSON text, one leaf: Composer's sharded checkpoints store the
        # dataset state through torch.distributed.checkpoint, which flattens nested dicts into keys and loads only
        # the keys of a template made by a fresh dataset (``loader`` null there); nested lanes would be missing keys
        return {"format": STATE_FORMAT, "epoch": epoch, "sample_in_epoch": sample_in_epoch,
                "num_canonical_nodes": self.num_canonical_nodes, "shuffle_seed": self.shuffle_seed,
                "global_batch_size": self.global_batch_size, "fingerprint": self.fingerprint,
                "config": self.config_summary,
                "loader": None if loader_state is None else canonical_json(loader_state)}

    def _gather(self, rank_state: dict, epoch: int, tag: str) -> dict:
        """Under torch.distributed: every rank's lanes merged on rank 0 (``zephon.host.gather_rank_states``, a
        gather, not an all-gather), and this rank's own lanes on the others. Else through ``aggregate_dir``
        (``gather_checkpoint``, in rounds named by epoch and step so every rank agrees), merged on every rank.
        Raises RuntimeError for several ranks and neither transport."""
        if self.dp_degree == 1:
            return merge_rank_states([rank_state])
        if self.rank % (self.replication or 1):
            # a replica holds the same lanes as the first rank of its group, which contributes them
            rank_state = self._plan(epoch).make_state([])
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            # Composer writes rank 0's dataset state alone (docs/streaming.md): the lanes go to rank 0, and every
            # other rank's result (its own lanes) is what Composer drops
            return gather_rank_states(rank_state, root=0, timeout=self.state_timeout) or rank_state
        if self.aggregate_dir is None:
            raise RuntimeError(f"state_dict at WORLD_SIZE={self.world_size} needs every rank's lanes: initialise "
                               f"torch.distributed, or pass aggregate_dir= (a directory all ranks share; or "
                               f"$ZEPHON_AGGREGATE_DIR)")
        config = uuid.uuid5(uuid.NAMESPACE_OID, self.fingerprint).hex[:8]  # rounds of another config never collide
        return gather_checkpoint(rank_state, aggregate_dir=self.aggregate_dir, run_id=self._run_id(),
                                 world_size=self.world_size, rank=self.rank, timeout=self.state_timeout,
                                 tag=f"{tag}-{config}")

    def _run_id(self) -> str:
        return self.run_id or ("zs-" + self.fingerprint[:16])

    def load_state_dict(self, obj) -> None:
        """Composer's call: validate ``obj`` now and use it for the next ``__iter__`` only.

        obj: a ``state_dict`` result (None: nothing to load). Raises ``CheckpointError`` saying what differs (a
        mosaicml-streaming state, another config, malformed values, lanes that do not restore)."""
        if obj is None:
            return
        _check_format(obj)
        obj = _decoded(obj)
        diffs = []
        if obj.get("global_batch_size") != self.global_batch_size:
            diffs.append(f"global batch size: state has {obj.get('global_batch_size')}, this run has "
                         f"{self.global_batch_size} (batch_size={self.batch_size} x {self.dp_degree} ranks); at "
                         f"{self.dp_degree} ranks use batch_size={_div(obj.get('global_batch_size'), self.dp_degree)}")
        if obj.get("shuffle_seed") != self.shuffle_seed:
            diffs.append(f"shuffle_seed: state has {obj.get('shuffle_seed')}, this dataset has {self.shuffle_seed}")
        if diffs:
            raise CheckpointError("state was made with another config: " + "; ".join(diffs))
        if obj.get("num_canonical_nodes") != self.num_canonical_nodes:
            if self._lanes_given:
                raise CheckpointError(f"state was made with another config: num_canonical_nodes: state has "
                                           f"{obj.get('num_canonical_nodes')}, this dataset has "
                                           f"{self.num_canonical_nodes}")
            self._configure(obj.get("num_canonical_nodes"))  # Mosaic adopts the checkpoint's, so do we
        if obj.get("fingerprint") != self.fingerprint:
            d = self._plan(0).config_diff(obj.get("config", {}))
            raise CheckpointError("state was made with another config: " +
                                       ("; ".join(d) if d else "fingerprints differ (dataset content or settings)"))
        e, n = obj.get("epoch"), obj.get("sample_in_epoch")
        if not (isinstance(e, int) and e >= 0 and isinstance(n, int) and 0 <= n <= self.length * self.dp_degree
                and n % self.global_batch_size == 0):
            raise CheckpointError(f"malformed state: epoch={e!r}, sample_in_epoch={n!r}")
        if obj.get("loader") is not None:
            self._session(e, obj["loader"])  # validates now (fingerprint, lanes)
        elif n:
            raise CheckpointError(f"malformed state: sample_in_epoch={n} without lane entries")
        self._channel.set_pending(obj)


def _decoded(obj: dict) -> dict:
    """``obj`` with its ``loader`` as a dict (``state_dict`` writes it as JSON text; a dict is accepted as
    earlier versions wrote it). Raises ``CheckpointError`` when the text is not a JSON object."""
    raw = obj.get("loader")
    if not isinstance(raw, str):
        return obj
    try:
        loader = json.loads(raw)
    except ValueError as e:
        raise CheckpointError(f"malformed state: 'loader' is not JSON ({e})") from None
    if not isinstance(loader, dict):
        raise CheckpointError(f"malformed state: 'loader' is JSON {type(loader).__name__}, not an object")
    return dict(obj, loader=loader)


def _check_format(obj) -> None:
    """Refuse ``obj`` unless it is a zephon_streaming state.

    obj: what ``load_state_dict`` was given (not None). Raises ``CheckpointError`` naming a mosaicml-streaming
    state as such, and any other object by its format (or type).
    """
    if isinstance(obj, dict) and obj.get("format") == STATE_FORMAT:
        return
    if isinstance(obj, dict) and {"epoch", "sample_in_epoch", "num_canonical_nodes"} <= set(obj):
        raise CheckpointError(
            "this is a mosaicml-streaming state: Zephon's sample order differs from Mosaic's, so a position "
            "in Mosaic's order cannot be continued exactly; start this dataset fresh (drop the dataset state "
            "from the checkpoint) or resume with streaming.StreamingDataset")
    raise CheckpointError(f"not a zephon_streaming state (format "
                          f"{obj.get('format') if isinstance(obj, dict) else type(obj).__name__!r}, "
                          f"expected {STATE_FORMAT!r})")
