"""``ChunkPointers``: the sample pointers of one chunk of a lane, as ``WorkSource.chunk`` returns them."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class ChunkPointers:
    """The sample pointers of one chunk, as parallel int64 arrays of equal length (<= chunk_size).

    ``positions``: global stream positions (unique over the whole run: the element identity);
    ``dataset_ids``, ``shard_ids``, ``sample_idx``: the sample pointer; ``passes``: which pass over its
    dataset the draw belongs to (0 for the first time through)."""
    lane: int
    chunk_id: int
    positions: np.ndarray
    dataset_ids: np.ndarray
    shard_ids: np.ndarray
    sample_idx: np.ndarray
    passes: np.ndarray

    def __len__(self) -> int:
        return int(self.positions.size)

    def slice(self, start: int, stop: int) -> "ChunkPointers":
        return ChunkPointers(self.lane, self.chunk_id, self.positions[start:stop], self.dataset_ids[start:stop],
                             self.shard_ids[start:stop], self.sample_idx[start:stop], self.passes[start:stop])
