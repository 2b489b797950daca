"""Energon-prepared WebDataset datasets (megatron-energon 7.4 ``energon prepare``), read without Energon.

Independent reader of the on-disk format: ``megatron.energon`` and ``webdataset`` are never imported (the
tests use them as the reference). One module per job:

- ``yamlio``: YAML/JSON config files typed like Energon's rapidyaml loader;
- ``braces``: brace expansion of shard names; ``fields``: ``field_map`` access paths;
- ``nvmeta``: the ``.nv-meta/`` folder (``.info.json``, ``split.yaml``, ``dataset.yaml``);
- ``wds``: WebDataset member naming and part decoding; ``tar_index``: ``.tar.idx`` offsets, one sample's bytes;
- ``reader``: random access to one tar shard; ``dataset``: ``open_energon`` -> ``PreparedWebdataset``;
- ``subset`` and ``metadataset``: Metadataset v2 YAML (blend, blend_epochized, subset ranges, join);
- ``join``: ``JoinedWebdataset``, samples of several prepared datasets matched by key;
- ``pyhooks``: ``DatasetFunction``, a dataset.yaml ``sample_loader`` / ``part_filter`` function in ``.nv-meta/``.

``open_dataset(path, format="energon", split_part=..., subset=...)`` (or a root holding ``.nv-meta/``) reaches
``open_energon``. The user guide is docs/energon.md.
"""
from . import wds
from .braces import braceexpand
from .dataset import FORMAT, PreparedWebdataset, open_energon
from .fields import field_access, split_field_access
from .join import JOIN, NONMATCH, JoinedWebdataset
from .metadataset import jsonl_leaf, load_metadataset
from .nvmeta import (INDEX_SQLITE, INFO_JSON, INFO_YAML, MAIN_FOLDER, is_energon_source, read_dataset_config,
                     read_info, read_split, resolve_part_filter)
from .reader import ShardMeta, TarShardReader
from .subset import as_subset, merge_subset, parse_subset, subset_bounds
from .tar_index import ITAR_SUFFIX, itar_path, list_keys, parse_sample, read_tar_index, sample_key_at
from .wds import DEFAULT_IMAGE_DECODE, IMAGE_SPECS, UnsafePartError, decode_part, split_name
from .yamlio import load_yaml

__all__ = ["DEFAULT_IMAGE_DECODE", "FORMAT", "IMAGE_SPECS", "INDEX_SQLITE", "INFO_JSON", "INFO_YAML", "ITAR_SUFFIX",
           "JOIN", "JoinedWebdataset", "MAIN_FOLDER", "NONMATCH", "PreparedWebdataset", "ShardMeta",
           "TarShardReader", "UnsafePartError", "as_subset", "braceexpand", "decode_part", "field_access",
           "is_energon_source", "itar_path", "jsonl_leaf", "list_keys", "load_metadataset", "load_yaml", "merge_subset",
           "open_energon", "parse_sample", "parse_subset", "read_dataset_config", "read_info", "read_split",
           "read_tar_index", "resolve_part_filter", "sample_key_at", "split_field_access", "split_name",
           "subset_bounds", "wds"]
