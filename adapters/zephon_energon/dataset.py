"""``get_train_dataset`` / ``get_val_dataset(s)``: Energon's entry points on Zephon lanes.

Translates Energon's keywords into a Zephon pipeline (operators, lanes, chunking, flush span) for one
data-parallel rank and returns it as an ``EnergonDataset`` (pipeline.py, which shows its stages). Keywords:
keywords.py; where samples come from (datasets, metadatasets, blend weights): sources.py. See docs/energon.md.
"""
from __future__ import annotations

import os
import warnings

from megatron.energon import DefaultTaskEncoder

from zephon.ops import Batch, Filter, GroupBatch, Shuffle
from zephon.work import TopologyError, lanes_for_rank

from ._group import GroupCriterion
from ._hooks import fn_name, keep, overridden
from ._join import JoinFactory
from ._pack import TaskPack
from ._samples import EncodeSamples, JsonlFactory, SampleFactory
from .keywords import (DEFAULT_CANONICAL_REPLICAS, ZEPHON_KEYWORDS, RefusedKeyword, ZephonEnergonWarning,
                       check_worker_config, deprecated_keywords, error_handler, refuse)
from .pipeline import EnergonDataset
from .sources import _open_sources, _weights

__all__ = ["DEFAULT_CANONICAL_REPLICAS", "EnergonDataset", "RefusedKeyword", "ZephonEnergonWarning",
           "get_train_dataset", "get_val_dataset", "get_val_datasets"]


def _build(path, *, split_part, worker_config, batch_size, batch_drop_last, packing_buffer_size, shuffle_buffer_size,
           task_encoder, repeat, training, virtual_epoch_length=0, limit=None, kwargs, entries=None,
           epochs: int = 1) -> EnergonDataset:
    check_worker_config(worker_config)
    if batch_size is not None and (not isinstance(batch_size, int) or batch_size < 1):
        raise ValueError(f"batch_size must be an int >= 1 or None, got {batch_size!r}")
    if task_encoder is None:
        task_encoder = DefaultTaskEncoder()
    zk, subflavors = _take_keywords(kwargs, task_encoder)

    sources = _open_sources(path, split_part, {}) if entries is None else entries
    if subflavors:  # Energon: the keyword merge-overrides the (meta)dataset's subflavors of every sample
        sources = [(ds, dict(e, subflavors={**(e.get("subflavors") or {}), **subflavors})) for ds, e in sources]
    datasets, weights, metas, quota = _weights(sources, repeat, zk.get("schedule_step_size"))
    factories = [JoinFactory(ds, e) if e.get("join") else JsonlFactory(e["path"], e.get("subflavors")) if e.get("jsonl")
                 else
                 SampleFactory(e["path"], getattr(ds, "energon", {}) or {}, e.get("subflavors"))
                 for ds, e in zip(datasets, metas)]
    seed = int(getattr(worker_config, "seed_offset", 0) or 0)
    handler = error_handler(worker_config)
    ops = [EncodeSamples(factories, task_encoder, postencode=packing_buffer_size is None, seed_offset=seed,
                         error_handler=handler),
           Filter(keep, name="zephon_energon.skipped")]
    if training and shuffle_buffer_size is not None and shuffle_buffer_size > 1:
        ops.append(Shuffle(int(shuffle_buffer_size), seed=seed))
    if packing_buffer_size is not None:
        ops.append(TaskPack(task_encoder, packing_buffer_size, seed_offset=seed, error_handler=handler))
    grouped = overridden(task_encoder, "batch_group_criterion")
    if grouped:  # Energon's GroupBatchDataset: one bucket per group and lane; a lane step is one group batch
        ops.append(GroupBatch(GroupCriterion(task_encoder, batch_size, seed_offset=seed, error_handler=handler),
                              key_name=fn_name(task_encoder.batch_group_criterion), drop_last=bool(batch_drop_last),
                              max_carry=int(zk.get("group_max_carry", 4096))))
        ops.append(Batch(1, drop_last=False))
    else:
        ops.append(Batch(batch_size or 1, drop_last=bool(batch_drop_last)))

    total = sum(d.num_samples for d in datasets)
    R, chunk, assignment = _lane_layout(zk, worker_config, training, total, batch_size)
    # A shuffle buffer fills once per span (a restore replays at most what a cold start fills); a packing
    # buffer gets 4 fills between its forced flushes.
    span = int(zk.get("flush_span") or max(256, 4 * (packing_buffer_size or 0), shuffle_buffer_size or 0))
    loader_kwargs = dict(seed=seed, canonical_replicas=R, chunk_size=chunk, flush_span=span,
                         shuffle=training, exhaustion="repeat" if (training and repeat) else
                         "quota" if quota else "stop",
                         dp_degree=worker_config.world_size, dp_rank=worker_config.rank,
                         lane_assignment=assignment, pad_tail=False,  # TaskEncoder batches hold no padding
                         epochs_per_pass=_epochs_per_pass(epochs, metas) if training else None)
    ds = EnergonDataset(datasets=datasets, weights=weights, ops=ops, loader_kwargs=loader_kwargs,
                        worker_config=worker_config, task_encoder=task_encoder, batch_size=batch_size,
                        training=training, virtual_epoch_length=virtual_epoch_length, limit=limit,
                        seed_offset=seed, sources=[e for _, e in sources], grouped=grouped)
    _check_lanes(ds, path, total, batch_size, explicit_replicas="canonical_replicas" in zk)
    return ds


def _epochs_per_pass(multiplier: int, metas) -> list[int]:
    """Energon's ``shuffle_over_epochs_multiplier`` per dataset: the keyword's times the metadataset entry's.
    Raises ``RefusedKeyword`` for an entry's -1 (see ``get_train_dataset``)."""
    out = []
    for e in metas:
        own = e.get("shuffle_over_epochs_multiplier") or 1
        if own == -1 or not isinstance(own, int) or own < 1:
            refuse("shuffle_over_epochs_multiplier", f"{own} in the metadataset entry of {e['path']}: only ints >= 1 "
                   f"map onto lanes (see get_train_dataset)")
        out.append(multiplier * own)
    return out


def _take_keywords(kwargs: dict, task_encoder) -> tuple[dict, dict | None]:
    """Pop the Zephon extras and ``subflavors`` off ``kwargs``; refuse every keyword left that cannot be honoured.

    kwargs: the caller's extra keywords (emptied here). task_encoder: the TaskEncoder in use.
    Returns ``(zephon_keywords, subflavors)``. Raises RefusedKeyword, or ValueError for a non-dict subflavors.
    """
    zk = {k: kwargs.pop(k) for k in ZEPHON_KEYWORDS if k in kwargs}
    deprecated_keywords(kwargs, task_encoder)
    if kwargs.pop("cache_pool", None) is not None:
        refuse("cache_pool", "auxiliary file stores and cache pools are not supported by zephon_energon")
    for k in ("dataset_config", "split_config"):
        if k in kwargs:
            v = kwargs.pop(k)
            default = "dataset.yaml" if k == "dataset_config" else "split.yaml"
            if v != default:
                refuse(k, f"{v!r}: zephon's reader reads .nv-meta/{default} only")

    subflavors = kwargs.pop("subflavors", None)
    if subflavors is not None and not isinstance(subflavors, dict):
        raise ValueError(f"subflavors must be a dict, got {type(subflavors).__name__}")
    if kwargs:
        refuse(", ".join(sorted(kwargs)), "not an Energon keyword zephon_energon can honour "
               f"(Zephon extras: {', '.join(ZEPHON_KEYWORDS)})")
    return zk, subflavors


def _lane_layout(zk: dict, worker_config, training: bool, total: int, batch_size) -> tuple[int, int, str]:
    """Lanes, chunk size and lane assignment of a training or a validation dataset.

    zk: the Zephon keywords given. worker_config: Energon's WorkerConfig. training: a training dataset.
    total: samples over all sources. batch_size: rows per batch (for the message).
    Returns ``(canonical_replicas, chunk_size, lane_assignment)``. Raises TopologyError when training ranks
    outnumber the lanes.
    """
    if training:
        R = int(zk.get("canonical_replicas", DEFAULT_CANONICAL_REPLICAS))
        chunk = int(zk.get("chunk_size") or max(1, min(256, total // R)))
        assignment = zk.get("lane_assignment", "contiguous")
        if worker_config.world_size > R:  # a lane's step is one TaskEncoder batch: ranks cannot split it
            raise TopologyError(f"world_size={worker_config.world_size} is more than canonical_replicas={R} lanes: "
                                f"zephon_energon gives each rank whole batches of batch_size={batch_size} from its "
                                f"own lanes, one TaskEncoder batch per lane step, so ranks cannot share a lane "
                                f"(sharing would need two batches per lane step: another global batch, a config whose "
                                f"checkpoints smaller world sizes refuse); set canonical_replicas (a Zephon keyword) "
                                f"to a multiple of every world size you use")
        return R, chunk, assignment
    # Validation restarts every iteration: no lanes need to outlive a run. Energon splits the split into
    # world_size x num_workers near-equal slices (one per rank-worker); one lane per rank-worker, samples
    # dealt one at a time (chunk_size 1) and lanes interleaved over ranks give every lane Energon's slice
    # size (q or q + 1 samples), so batches are full and ranks' batch counts as balanced as Energon's.
    R = int(zk.get("canonical_replicas") or worker_config.world_size * max(1, worker_config.num_workers))
    return R, int(zk.get("chunk_size") or 1), zk.get("lane_assignment", "interleaved")


def _check_lanes(ds, path, total, batch_size, explicit_replicas) -> None:
    """A dataset (pass) too small for its lanes must not go unnoticed: empty lanes put one sample twice in a
    batch (``repeat``) or leave ranks without data (one pass: their collectives would wait forever)."""
    L, wc = ds.plan, ds.worker_config
    R, src, W = L.canonical_replicas, L.source, wc.world_size
    finite = src.total_positions is not None
    n = src.total_positions if finite else total
    per_lane = [src.lane_positions(lane) for lane in range(R)] if finite else None
    idle = [r for r in range(W) if not any(per_lane[lane] for lane in lanes_for_rank(
        R, W, r, L.lane_assignment))] if finite else []
    if not ds.training:
        if n < R and not explicit_replicas:
            warnings.warn(f"{path}: {n} validation samples for {R} rank-workers (world_size x num_workers slices, as "
                          f"Energon splits them): {R - n} get no sample" +
                          (f"; ranks {idle} get none at all" if idle else ""), ZephonEnergonWarning, stacklevel=4)
        elif explicit_replicas and batch_size and max(per_lane) < batch_size:
            warnings.warn(f"{path}: {n} validation samples over canonical_replicas={R} lanes give at most "
                          f"{max(per_lane)} samples per lane, fewer than batch_size={batch_size}: every batch is "
                          f"short; leave canonical_replicas unset for validation (one lane per rank-worker)",
                          ZephonEnergonWarning, stacklevel=4)
        return
    if n >= R:
        return
    fit = (f"set canonical_replicas (a Zephon keyword) to at most {n}, a multiple of every world size you use "
           f"(e.g. {n - n % W} at world_size={W})") if n >= W else \
        f"use fewer than {n + 1} ranks, or a larger dataset"
    what = f"{path}: {n} samples per pass for canonical_replicas={R} lanes"
    if finite and idle:
        raise ValueError(f"{what}: with repeat=False {R - n} lanes get no sample and ranks {idle} of world_size={W} "
                         f"get no data at all (their training loop would wait forever on the others); {fit}")
    if finite:
        warnings.warn(f"{what}: with repeat=False {R - n} lanes get no sample, so ranks get unequal numbers of "
                      f"batches; {fit}", ZephonEnergonWarning, stacklevel=4)
    else:
        warnings.warn(f"{what}: a lane sees a sample only every ~{-(-R // n)} passes, so a batch mixes passes (the "
                      f"same sample can appear twice in one batch); {fit}", ZephonEnergonWarning, stacklevel=4)


def get_train_dataset(path, *, split_part="train", worker_config, batch_size, batch_drop_last: bool = False,
                      packing_buffer_size=None, shuffle_buffer_size, max_samples_per_sequence,
                      virtual_epoch_length: int = 0, shuffle_over_epochs_multiplier=1, task_encoder=None,
                      repeat: bool = True, **kwargs) -> EnergonDataset:
    """Energon's ``get_train_dataset`` on Zephon lanes (same keywords; see docs/energon.md).

    ``max_samples_per_sequence`` is accepted and has no effect: Zephon reads samples by random access
    (``.tar.idx``) in its own permutation, so there are no sequential runs to bound.
    ``shuffle_over_epochs_multiplier`` m >= 1: a pass is m epochs shuffled together (every sample m times per
    pass, in any order), as Energon's; -1 is refused.
    Zephon extras: ``canonical_replicas`` (lanes, default 64; every world size used must divide it),
    ``chunk_size`` (default ``min(256, samples // canonical_replicas)``), ``flush_span`` (pointers per
    lane between accumulator flushes, default ``max(256, shuffle_buffer_size, 4 x packing_buffer_size)``),
    ``lane_assignment``, ``group_max_carry`` (grouped batching: short-bucket rows carried across a flush).
    Raises ``RefusedKeyword`` for a keyword it cannot honour, ``TopologyError`` when ``world_size`` does
    not divide ``canonical_replicas``."""
    if shuffle_over_epochs_multiplier == -1 or not (shuffle_over_epochs_multiplier is None or (
            isinstance(shuffle_over_epochs_multiplier, int) and shuffle_over_epochs_multiplier >= 1)):
        refuse("shuffle_over_epochs_multiplier", f"{shuffle_over_epochs_multiplier}: only ints >= 1 map onto lanes "
               f"(a pass of that many epochs shuffled together); -1 (drawing with replacement) has no pass, and a "
               f"pass is what makes every sample come exactly once per pass and a lane's pointers random-access; "
               f"use a large multiplier instead")
    if not isinstance(virtual_epoch_length, int) or virtual_epoch_length < 0:
        raise ValueError(f"virtual_epoch_length must be an int >= 0, got {virtual_epoch_length!r}")
    return _build(path, split_part=split_part, worker_config=worker_config, batch_size=batch_size,
                  batch_drop_last=batch_drop_last, packing_buffer_size=packing_buffer_size,
                  shuffle_buffer_size=shuffle_buffer_size, task_encoder=task_encoder, repeat=repeat, training=True,
                  virtual_epoch_length=virtual_epoch_length, kwargs=dict(kwargs),
                  epochs=shuffle_over_epochs_multiplier or 1)


def get_val_dataset(path, *, split_part="val", worker_config, batch_size, batch_drop_last: bool = False,
                    packing_buffer_size=None, limit=None, task_encoder=None, **kwargs) -> EnergonDataset:
    """Energon's ``get_val_dataset``: one pass in stored order (no shuffling) split over the ranks and
    workers as Energon splits it (one lane per rank-worker unless ``canonical_replicas`` is given);
    ``limit`` caps the batches per rank and iteration. Each ``iter()`` starts at the beginning."""
    return _val(path, split_part=split_part, worker_config=worker_config, batch_size=batch_size,
                batch_drop_last=batch_drop_last, packing_buffer_size=packing_buffer_size, limit=limit,
                task_encoder=task_encoder, kwargs=kwargs)


def _val(path, *, split_part, worker_config, batch_size, batch_drop_last, packing_buffer_size, limit, task_encoder,
         kwargs, entries=None) -> EnergonDataset:
    if limit is not None and (not isinstance(limit, int) or limit < 0):
        raise ValueError(f"limit must be an int >= 0 or None, got {limit!r}")
    return _build(path, split_part=split_part, worker_config=worker_config, batch_size=batch_size,
                  batch_drop_last=batch_drop_last, packing_buffer_size=packing_buffer_size, shuffle_buffer_size=None,
                  task_encoder=task_encoder, repeat=False, training=False, limit=limit or None, kwargs=dict(kwargs),
                  entries=entries)


def get_val_datasets(path, *, split_part="val", worker_config, batch_size, batch_drop_last: bool = False,
                     packing_buffer_size=None, limit=None, task_encoder=None, **kwargs):
    """Energon's ``get_val_datasets``: one ``(dataset, source)`` per dataset of a metadataset (``source``:
    its metadataset entry: path, weight, subset, subflavors, which the dataset keeps)."""
    out = []
    for src in _open_sources(os.fspath(path), split_part, {}):
        ds = _val(src[1]["path"], split_part=split_part, worker_config=worker_config, batch_size=batch_size,
                  batch_drop_last=batch_drop_last, packing_buffer_size=packing_buffer_size, limit=limit,
                  task_encoder=task_encoder, kwargs=kwargs, entries=[src])
        out.append((ds, src[1]))
    return out
