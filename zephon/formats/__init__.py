"""Format readers (leaves of the package: stdlib, numpy, pyarrow and zstandard only).

``open_dataset`` turns a source into a ``Dataset`` with random access by ``(shard_id, sample indices)``,
through the format table of ``registry`` (JSONL, Parquet, MDS, Energon); ``inspect_source`` summarises a
source; ``DataError`` reports bad input.
"""
from .base import Dataset, ShardInfo
from .errors import DamagedIndexError, DataError, DataWarning, UnsafeDataError
from .registry import FORMATS, inspect_source, open_dataset

__all__ = ["DamagedIndexError", "DataError",
           "DataWarning", "Dataset", "FORMATS", "ShardInfo", "UnsafeDataError", "inspect_source", "open_dataset"]
