"""Per-sample access for hosts whose datasets are indexed by a global sample id (Mosaic's ``__getitem__``).

A host subclass may override ``__getitem__(idx)`` and call the base's (llm-foundry's ``StreamingTextDataset``
tokenizes there). ``SampleItems`` numbers the source samples as Mosaic does (datasets, then shards, then samples,
concatenated in order), reads any one of them by id, and turns a delivered micro-batch into the host's items by
calling the host's ``__getitem__`` with each row's id while holding that row "in hand", so the base lookup of the id
being delivered costs no second read. The order stays Zephon's: only what an item looks like is the host's.
"""
from __future__ import annotations

import bisect
import itertools

from ..formats.records import src_of


class SampleItems:
    """Global sample ids over ``datasets`` and the hand-off of delivered rows to a host's ``__getitem__``.

    Args:
        datasets: the loader's ``zephon.formats`` datasets, in the loader's order (the ids' order).
    Picklable (host workers get a copy); the row in hand is per process.
    """

    def __init__(self, datasets):
        self.datasets = list(datasets)
        # starts[k]: the id of the first sample of the k-th (dataset, shard) pair, in order; plus the total
        self._pairs = [(d, s) for d, ds in enumerate(self.datasets) for s in range(len(ds.shard_sizes))]
        sizes = [self.datasets[d].shard_sizes[s] for d, s in self._pairs]
        self._starts = list(itertools.accumulate(sizes, initial=0))
        self._first = {pair: self._starts[k] for k, pair in enumerate(self._pairs)}
        self._in_hand = None  # (id, row) while a host's __getitem__ runs for a delivered row

    def __len__(self) -> int:
        """Samples over all datasets (one pass)."""
        return self._starts[-1]

    def id_of(self, src) -> int:
        """The global id of a row's source sample.

        src: the row's ``__src__`` (a ``Src`` or 4-tuple). Raises TypeError for a combined (packed) row, which
        has no single source sample."""
        s = src_of({"__src__": src})
        return self._first[(s.dataset, s.shard)] + s.sample

    def locate(self, idx: int) -> tuple[int, int, int]:
        """``(dataset, shard, sample)`` of global id ``idx``. Raises IndexError naming the valid range."""
        if isinstance(idx, bool) or not 0 <= int(idx) < len(self):
            raise IndexError(f"sample id {idx!r} out of range [0, {len(self)}) over {len(self.datasets)} "
                             f"stream(s)")
        idx = int(idx)
        k = bisect.bisect_right(self._starts, idx) - 1
        d, s = self._pairs[k]
        return d, s, idx - self._starts[k]

    def get(self, idx: int) -> dict:
        """The source sample ``idx`` as a dict of its columns: the row in hand when it is that sample, else read
        from its shard. Raises IndexError (see ``locate``) or the reader's DataError naming file, shard and
        sample."""
        if self._in_hand is not None and self._in_hand[0] == idx:
            return dict(self._in_hand[1])
        d, s, i = self.locate(idx)
        [rec] = self.datasets[d].read(s, [i])
        return {k: v for k, v in rec.items() if not (k.startswith("__") and k.endswith("__"))}

    def items(self, rows, srcs, getitem):
        """The host's items of delivered rows, in order: ``getitem(id)`` for each row, with the row in hand.

        rows: the rows' column dicts. srcs: their ``__src__``, in the same order. getitem: the host's
        ``__getitem__`` (bound). Raises what ``getitem`` raises, TypeError for packed rows."""
        for row, src in zip(rows, srcs):
            idx = self.id_of(src)
            self._in_hand = (idx, row)
            try:
                item = getitem(idx)
            finally:
                self._in_hand = None
            yield item
