"""Format readers (leaves of the package: stdlib, numpy, pyarrow and zstandard only).

``open_dataset`` turns files into a ``Dataset`` (one file = one shard) with random access by
``(shard_id, sample indices)``; ``inspect_source`` summarises a source; ``DataError`` reports bad input.
"""
from .base import Dataset, ShardInfo, inspect_source, open_dataset
from .errors import DataError, DataWarning

__all__ = ["DataError", "DataWarning", "Dataset", "ShardInfo", "inspect_source", "open_dataset"]
