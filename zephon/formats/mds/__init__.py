"""Mosaic MDS datasets: shards and ``index.json`` as written by ``streaming.MDSWriter`` (mosaicml-streaming 0.13).

An independent reader of the on-disk format; ``streaming`` is never imported (the tests use it as the
reference). Records decode to the same values and types as ``streaming.StreamingDataset``. One module per
job, as in ``streaming/base/format/mds/``: ``index`` (index.json), ``encodings`` (column values),
``integrity`` (hashes, offsets, shards past 4 GiB), ``decompress`` (compressed shards), ``reader`` (one
shard), ``dataset`` (``open_mds``).
"""
from .dataset import MdsDataset, open_mds
from .decompress import decompressed_path
from .encodings import UNSAFE_ENCODINGS, column_codec
from .index import FORMAT, INDEX_BASENAME, FileEntry, ShardMeta, data_file, find_index, is_mds_source, parse_index
from .integrity import XXHASH_ALGORITHMS, ShardRefused, file_digest, hash_algorithms, sample_offsets, unwrap_offsets
from .reader import MdsReader

__all__ = ["FORMAT", "INDEX_BASENAME", "UNSAFE_ENCODINGS", "XXHASH_ALGORITHMS", "FileEntry", "MdsDataset", "MdsReader",
           "ShardMeta", "ShardRefused", "column_codec", "data_file", "decompressed_path", "file_digest", "find_index",
           "hash_algorithms", "is_mds_source", "open_mds", "parse_index", "sample_offsets", "unwrap_offsets"]
