"""torch DataLoaders whose state is the rank's Zephon checkpoint.

They iterate a ``ZephonIterableDataset`` with ``batch_size=None`` (one item per worker and (step, micro-batch): the
list of its lanes' micro-batches, ``zephon.host.workers.bundled``); ``zephon.host.RankSession`` puts the rank's lane
micro-batches of each (step, micro-batch) back together and records each lane's checkpoint entry as it is handed to
the training loop. The state therefore reflects exactly what the loop consumed, and it does not depend on
``num_workers`` or prefetching: save with 2 workers, resume with 0 or 3. This module translates torch's keywords,
converts micro-batches to tensors and hands a user's ``collate_fn`` the samples of each local micro-batch (in the
consuming process, where the rank's lanes meet); nothing else.
"""
from __future__ import annotations

import numpy as np
import torch
import torch.utils.data
import torch.utils.data._utils.collate as _torch_collate
from torchdata.stateful_dataloader import StatefulDataLoader as _TorchdataStatefulDataLoader

from zephon.checkpoint import check_given
from zephon.host import SavedRanks

from .dataset import ZephonIterableDataset, to_torch

#: Per-row values of varying length: always a list with one tensor per row.
_RAGGED = ("cu_seqlens",)


def _concat(group: list, env: dict | None = None) -> dict:
    """Concatenate a group's lane micro-batches (``(meta, numpy micro-batch)``, same step and micro-batch
    index, lane order) along rows, then convert to torch (``to_torch``). Adds ``__lane__`` (per row),
    ``__step__``, ``__micro__`` and, in a finite pass's padded last step, ``__pad__`` (per row: True for a
    padding row): ``_envelope(group)`` unless ``env`` is given."""
    parts = [p for _, p in group]
    out = {}
    for k in parts[0]:
        vals = [p[k] for p in parts]
        if k in _RAGGED or (isinstance(vals[0], np.ndarray) and len({v.shape[1:] for v in vals}) > 1):
            out[k] = [row for v in vals for row in v]  # one array per row (document boundaries vary)
        elif isinstance(vals[0], np.ndarray):
            out[k] = np.concatenate(vals) if len(vals) > 1 else vals[0]
        else:
            out[k] = [x for v in vals for x in v] if isinstance(vals[0], list) else vals
    out = to_torch(out)
    out.update(_envelope(group) if env is None else env)
    return out


#: torch's own defaults spelled out: they mean "no collate_fn" (the numpy transport, then ``_concat``).
_TORCH_DEFAULTS = (torch.utils.data.default_collate, torch.utils.data.default_convert,
                   _torch_collate.default_collate, _torch_collate.default_convert)


def _is_torch_default(fn) -> bool:
    return fn is None or any(fn is f for f in _TORCH_DEFAULTS)


def _rows(group: list) -> list[dict]:
    """A group's samples, one dict per row in lane order, as ``ZephonIterableDataset`` yields them converted
    (``to_torch``): the rows ``_concat`` would put into the local micro-batch, padding rows included."""
    out = []
    for meta, payload in group:
        if payload is None:
            continue
        mb = to_torch(payload)
        out.extend({k: v[i] for k, v in mb.items()} for i in range(meta["rows"]))
    return out


def _envelope(group: list) -> dict:
    """The adapter's transport metadata of a group (``__lane__`` per row, ``__step__``, ``__micro__``,
    ``__pad__`` per row in a padded step), as ``_concat`` adds it to a default batch."""
    rows = [(m, i) for m, p in group if p is not None for i in range(m["rows"])]
    env = {"__lane__": torch.tensor([m["lane"] for m, _ in rows], dtype=torch.long),
           "__step__": group[0][0]["step"], "__micro__": group[0][0]["micro"]}
    if any(m.get("pad") for m, _ in group):
        env["__pad__"] = torch.tensor([i >= m["rows"] - m.get("pad", 0) for m, i in rows])
    return env


def _as_is(item):
    """collate_fn for ``batch_size=None``: keep the worker's numpy micro-batch. torch's default would make
    tensors, which cross processes one shared-memory handle per tensor (a connection handshake each)
    instead of one pickled buffer; conversion happens once per local micro-batch in the main process."""
    return item


class _RankStateMixin:
    """State handling shared by both DataLoader flavours (see the module docstring)."""

    def _zephon_init(self, dataset, kwargs):
        if not isinstance(dataset, ZephonIterableDataset):
            raise TypeError(f"{type(self).__name__} needs a zephon_torch.ZephonIterableDataset, "
                            f"got {type(dataset).__name__}")
        if kwargs.get("batch_size", None) is not None:
            raise ValueError("batch_size must be None: the Zephon pipeline batches (its final Batch(micro_batch_size) "
                             "operator and global_batch_size); one item is one local micro-batch")
        if kwargs.get("persistent_workers"):
            raise ValueError("persistent_workers=True would carry rows prefetched but never consumed into the next "
                             "iteration; Zephon restarts workers from the consumed state instead")
        kwargs["batch_size"] = None
        # The workers always send (meta, numpy micro-batch) items (see _as_is); torch's own default collate
        # spelled out is no collate_fn. A user's collate_fn gets one local micro-batch's samples in the
        # consuming process: a worker holds only its lanes, never a whole local micro-batch.
        user = kwargs.pop("collate_fn", None)
        self.user_collate = None if _is_torch_default(user) else user
        kwargs["collate_fn"] = _as_is
        dataset.report_drops = True
        self._session = dataset.session
        self.batch_info: dict | None = None  # the envelope of the last batch handed out (see _build)

    @property
    def dropped_rows(self) -> int:
        """A finite stream's rows after the last step every lane and rank completed."""
        return self._session.dropped_rows

    def _build(self, group):
        """A group (one local micro-batch) -> what the loop receives: ``_concat`` of it, or the user's
        ``collate_fn(rows)``. The envelope (``__lane__``, ``__step__``, ``__micro__``, ``__pad__``) is kept in
        ``batch_info``, and also set on a dict the user's collate returns unless it has those keys."""
        env = _envelope(group)
        self.batch_info = env
        if self.user_collate is None:
            return _concat(group, env)
        out = self.user_collate(_rows(group))
        if isinstance(out, dict):
            for k, v in env.items():
                out.setdefault(k, v)
        return out

    def _assembled(self, bundles):
        # _build runs before the group counts as consumed: an exception in it (the user's collate_fn
        # included) loses nothing; the state is recorded as each result is handed to the loop.
        items = (item for bundle in bundles for item in bundle)  # a worker's items of num_workers positions
        yield from self._session.ordered_groups(items, build=self._build)

    def _before_iter(self):
        # A new iteration (or the first after load_state_dict) starts from what was consumed.
        self._session.begin()
        self.dataset._live = None

    def rank_state_dict(self) -> dict:
        """This rank's checkpoint (its lanes) as of the last local micro-batch handed out: JSON data."""
        return self._session.rank_state()

    def state_dict(self) -> dict:
        """This rank's state, as torchdata's per-rank protocol has it: its lanes only, with the topology it was
        saved at (``zephon.host.rank_checkpoint``), JSON data, no collective. Store one per rank (a file, a DCP
        key); restore it here, or at another dp degree through ``load_state_dict(zephon.host.SavedRanks(...))``."""
        return self._session.saved_rank_state()

    def load_state_dict(self, state) -> None:
        """Start the next ``iter()`` from ``state``: this rank's ``state_dict()``, a merged state
        (``global_state_dict``), or a ``zephon.host.SavedRanks`` of a save at any dp degree (only the old ranks
        holding this rank's lanes are read). Raises ``CheckpointError`` naming what differs or lacks."""
        check_given(state, f"{type(self).__name__}.load_state_dict", also=(SavedRanks,))  # None: no silent step 0
        self.dataset.load_state_dict(state)  # validates: CheckpointError names what differs / lacks

    def global_state_dict(self, **gather_kwargs) -> dict:
        """Every rank's state merged (a collective when torch.distributed is initialised: call it on
        all ranks; see ``zephon.host.gather_checkpoint`` for ``aggregate_dir``/``run_id``/``timeout``: seconds
        a rank waits for the others, default 300, then an error naming the missing ranks).
        Restorable at any dp degree that divides ``canonical_replicas``."""
        return self._session.global_state(**gather_kwargs)


class DataLoader(_RankStateMixin, torch.utils.data.DataLoader):
    """``torch.utils.data.DataLoader`` over a ``ZephonIterableDataset`` with a rank checkpoint.

    Same keyword arguments as torch's DataLoader (``num_workers``, ``pin_memory``, ``prefetch_factor``,
    ``multiprocessing_context``, ...); ``batch_size`` must be None and ``persistent_workers`` False.
    Yields local micro-batches: the rank's lane micro-batches of one (step, micro) concatenated in lane
    order, tensors ``[lanes * micro_batch_size, max_length]`` plus ``__lane__`` (per row), ``__step__``,
    ``__micro__``. ``collate_fn``: None, or torch's ``default_collate`` / ``default_convert`` spelled out, gives
    those batches; any other function is called, in the main process, with the list of one local micro-batch's
    samples (one dict per row, lane order, as ``ZephonIterableDataset`` yields them; padding rows of a finite
    pass's last step included, flagged in ``__pad__``), and its result is what the loop receives; when that
    result is a dict, ``__lane__``, ``__step__``, ``__micro__`` (and ``__pad__``) are added unless present.
    ``batch_info`` holds them for the last batch handed out, whatever the result. ``state_dict()`` (this
    rank's lanes, no collective; ``global_state_dict()`` merges every rank's) and ``load_state_dict(state)`` (a
    rank's or a merged state, or a ``zephon.host.SavedRanks``; the next ``iter()`` starts there). Raises
    ``CheckpointError`` for a state of another config or missing lanes."""

    def __init__(self, dataset, **kwargs):
        self._zephon_init(dataset, kwargs)
        super().__init__(dataset, **kwargs)

    def __iter__(self):
        self._before_iter()
        return self._assembled(super().__iter__())


class StatefulDataLoader(_RankStateMixin, _TorchdataStatefulDataLoader):
    """``torchdata.stateful_dataloader.StatefulDataLoader`` whose state is Zephon's rank checkpoint.

    An instance of torchdata's class (same keyword arguments; ``batch_size`` None, ``persistent_workers``
    False), but ``state_dict()`` returns plain JSON data that does not depend on ``num_workers`` (torchdata's
    own per-worker snapshots require the same worker count), so ``load_state_dict`` accepts a state saved
    with any number of workers; at another dp degree, a merged state or ``zephon.host.SavedRanks`` of the ranks'
    own states (docs/distributed.md). Yields what
    ``zephon_torch.DataLoader`` yields."""

    def __init__(self, dataset, **kwargs):
        self._zephon_init(dataset, kwargs)
        # torchdata's worker snapshots are not used (the state comes from consumed items): take them rarely.
        kwargs.setdefault("snapshot_every_n_steps", 1 << 30)
        super().__init__(dataset, **kwargs)

    def __iter__(self):
        self._before_iter()
        self.next_iter_state = None  # torchdata's per-worker replay is not used: workers start from our state
        self._iterator = None
        return self._assembled(super().__iter__())

    def load_state_dict(self, state) -> None:
        super().load_state_dict(state)  # the mixin's (torchdata's own is for its worker snapshots)
        self._iterator = None
