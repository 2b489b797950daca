"""``get_train_dataset`` / ``get_val_dataset``: Energon's entry points on Zephon lanes.

A returned dataset is a torch ``IterableDataset`` holding one data-parallel rank's Zephon pipeline:

    WorkSource (mixture of the prepared datasets, seeded permutations, ``canonical_replicas`` lanes)
      -> workers: read tar members (``.tar.idx`` random access), build Energon samples from
         ``field_map`` (or crude samples + cookers), ``encode_sample``            [EncodeSamples]
      -> pump, one accumulator per lane: shuffle buffer (``shuffle_buffer_size``), the task
         encoder's packing (``packing_buffer_size``)                              [Shuffle, TaskPack]
      -> tail: ``batch_size`` rows of one lane per micro-batch (``batch_drop_last``) [Batch]
      -> ``task_encoder.batch`` + ``encode_batch`` on that lane micro-batch.

Iterated by a DataLoader worker it owns ``split_lanes(rank_lanes, num_workers, worker_id)`` and yields
``(meta, batch)`` pairs whose ``meta`` carries the lane's checkpoint entry; the loaders of this package
(``get_savable_loader``) put the lanes back in the rank's order and keep the consumed state.
"""
from __future__ import annotations

import gc
import os
import warnings

from torch.utils.data import IterableDataset, get_worker_info

from megatron.energon import DefaultTaskEncoder, WorkerConfig
from megatron.energon.errors import reraise_exception

from zephon.engine import Loader
from zephon.ops import Batch, Filter, Shuffle
from zephon.work import lanes_for_rank, split_lanes

from ._encode import EncodeSamples, SampleFactory, TaskPack, _call, _expand, energon_context, keep, overridden

#: Zephon keywords accepted on top of Energon's (documented in docs/energon.md).
ZEPHON_KEYWORDS = ("canonical_replicas", "chunk_size", "flush_span", "lane_assignment")
DEFAULT_CANONICAL_REPLICAS = 64


class RefusedKeyword(ValueError):
    """An Energon keyword (or value) zephon_energon cannot honour; the message says why."""


class ZephonEnergonWarning(UserWarning):
    """A configuration zephon_energon runs but that is probably not what was meant (the message says why
    and what to set)."""


def _refuse(name, reason):
    raise RefusedKeyword(f"{name}: {reason}")


def _check_worker_config(wc) -> None:
    if wc is None:
        raise ValueError("worker_config is required (WorkerConfig(rank=, world_size=, num_workers=)), as in Energon")
    for attr in ("rank", "world_size", "num_workers"):
        v = getattr(wc, attr, None)
        if not isinstance(v, int) or v < 0:
            raise ValueError(f"worker_config.{attr} must be an int >= 0, got {v!r}")
    if getattr(wc, "worker_debug_path", None) is not None or getattr(wc, "worker_log_level", 0):
        _refuse("worker_config.worker_debug_path/worker_log_level", "Energon's per-worker debug log is not written by "
                "zephon_energon; Loader statistics come from SavableDataLoader.stats()")


def _handler(wc):
    """The hook error handler: Energon's ``global_error_handler`` (default: log and skip the sample)."""
    h = getattr(wc, "global_error_handler", None)
    return None if h is None or h is reraise_exception else h


def _open_sources(path, split_part, kwargs):
    """``[(zephon Dataset, SampleFactory-args, weight, repetitions)]`` for a prepared dataset directory or
    a metadataset YAML."""
    from zephon.formats import open_dataset
    try:
        from zephon.formats import energon as efmt
    except ImportError as e:  # pragma: no cover - the reader ships with the core
        raise ImportError("zephon.formats.energon (the Energon-prepared WebDataset reader) is missing") from e

    path = os.fspath(path)
    if os.path.isfile(path):
        entries = efmt.load_metadataset(path, split_part)
    else:
        entries = [{"path": path, "weight": None, "subset": None, "repetitions": None, "subflavors": None,
                    "split_part": split_part}]
    out = []
    for e in entries:
        # Raw parts: the task encoder's own decoder (Energon's SampleDecoder) decodes them on the workers.
        open_kwargs = {"format": "energon", "split_part": e.get("split_part") or split_part, "decode": False}
        if e.get("subset"):
            open_kwargs["subset"] = e["subset"]
        ds = open_dataset(e["path"], **open_kwargs)  # no __fields__ without decoding: SampleFactory maps them
        out.append((ds, e))
    return out


def _weights(sources, repeat: bool):
    """Core datasets and mixture weights: ``blend`` weights as given; ``blend_epochized`` repetitions r
    (whole numbers) list the dataset r times, each weighted by its size, so one pass of the mixture is
    r passes of that dataset."""
    reps = [e.get("repetitions") for _, e in sources]
    if any(r not in (None, 1) for r in reps):
        datasets, weights, metas = [], [], []
        for (ds, e), r in zip(sources, reps):
            r = 1 if r is None else r
            if r != int(r) or r < 1:
                _refuse("blend_epochized repetitions", f"{r} for {e['path']}: only whole repetitions >= 1 are "
                        f"supported (use a subset range for a fraction)")
            for _ in range(int(r)):
                datasets.append(ds)
                weights.append(ds.num_samples)
                metas.append(e)
        return datasets, weights, metas
    ws = [e.get("weight") for _, e in sources]
    if len(sources) > 1 and any(w is not None for w in ws):
        if not repeat:
            _refuse("repeat=False", "a weighted blend repeats its datasets (Energon asserts repeat=True for blends too)")
        weights = [1.0 if w is None else float(w) for w in ws]
    elif len(sources) > 1:  # no weights (a concatenation): proportional to size, one pass of each
        weights = [ds.num_samples for ds, _ in sources]
    else:
        weights = None
    return [ds for ds, _ in sources], weights, [e for _, e in sources]


class EnergonDataset(IterableDataset):
    """One rank's pipeline (see the module docstring). Built by ``get_train_dataset`` /
    ``get_val_dataset``; attributes: ``worker_config``, ``loader`` (the rank's template
    ``zephon.Loader``: config, fingerprint, lanes, starting state; never iterated itself),
    ``batch_size``, ``virtual_epoch_length``, ``limit``, ``training``."""

    def __init__(self, *, datasets, weights, ops, loader_kwargs, worker_config, task_encoder, batch_size,
                 training: bool, virtual_epoch_length: int = 0, limit=None, seed_offset: int = 0,
                 gc_every: int = 0, sources=()):
        super().__init__()
        self.worker_config = worker_config
        self.task_encoder = task_encoder
        self.batch_size = batch_size
        self.training = training
        self.virtual_epoch_length = virtual_epoch_length
        self.limit = limit
        self.seed_offset = seed_offset
        self.gc_every = gc_every
        self.sources = list(sources)
        self._args = (list(datasets), list(ops))
        self._kwargs = dict(loader_kwargs, weights=weights)
        self.loader = self._new_loader(None)
        self._batch_hooks = overridden(task_encoder, "batch"), overridden(task_encoder, "encode_batch")

    def _new_loader(self, lanes) -> Loader:
        return Loader(*self._args, emit_state=True, runner="inline", num_workers=1, lanes=lanes, **self._kwargs)

    def build_loader(self, lanes=None) -> Loader:
        """A ``Loader`` for ``lanes`` (default: the whole rank) starting from this dataset's starting state."""
        L = self._new_loader(lanes)
        L.restore(self.loader.checkpoint())
        return L

    def __len__(self) -> int:
        if self.virtual_epoch_length:
            return self.virtual_epoch_length
        if self.limit:
            return self.limit
        raise TypeError("the length of a Zephon Energon dataset is known only with virtual_epoch_length (train) or "
                        "limit (val): packing, SkipSample and generator hooks change it")

    def __iter__(self):
        info = get_worker_info()
        lanes = None if info is None else split_lanes(self.loader.rank_lanes, info.num_workers, info.id)
        if lanes == []:
            return  # a worker with no share of the rank's lanes ends at once (the DataLoader skips it)
        L = self.build_loader(lanes)
        n = 0
        try:
            for mb in L:
                meta = {"lane": mb["__lane__"], "step": mb["__step__"], "micro": mb["__micro__"],
                        "state": mb["__state__"]}
                payloads = self._finish(mb)
                if not payloads:
                    yield dict(meta, last=True, skip=True), None
                for k, p in enumerate(payloads):
                    yield dict(meta, last=k == len(payloads) - 1, skip=False), p
                n += 1
                if self.gc_every and n % self.gc_every == 0:
                    gc.collect()
        finally:
            L.close()

    def _finish(self, mb) -> list:
        """A lane micro-batch -> what the loader yields: the sample (``batch_size=None``) or
        ``encode_batch(batch(samples))`` (a generator may give several batches, ``SkipSample`` none)."""
        samples = list(mb["sample"])
        if self.batch_size is None:
            return samples
        src = mb["__src__"][0]
        first = src[0][0] if isinstance(src, list) else src[3]
        record = {"__src__": src if not isinstance(src, list) else None}
        handler = _handler(self.worker_config)
        te = self.task_encoder
        with energon_context(self.seed_offset, first):
            batch = _call(te.batch, samples, record, handler, "batch")
            if batch is None:
                return []
            if not self._batch_hooks[1]:
                return [batch]
            return _expand(_call(te.encode_batch, batch, record, handler, "encode_batch"), record, handler,
                           "encode_batch")


def _build(path, *, split_part, worker_config, batch_size, batch_drop_last, packing_buffer_size, shuffle_buffer_size,
           task_encoder, repeat, training, virtual_epoch_length=0, limit=None, kwargs, entries=None) -> EnergonDataset:
    _check_worker_config(worker_config)
    if batch_size is not None and (not isinstance(batch_size, int) or batch_size < 1):
        raise ValueError(f"batch_size must be an int >= 1 or None, got {batch_size!r}")
    if task_encoder is None:
        task_encoder = DefaultTaskEncoder()
    zk = {k: kwargs.pop(k) for k in ZEPHON_KEYWORDS if k in kwargs}
    _deprecated(kwargs, task_encoder)
    if kwargs.pop("cache_pool", None) is not None:
        _refuse("cache_pool", "auxiliary file stores and cache pools are not supported by zephon_energon")
    for k in ("dataset_config", "split_config"):
        if k in kwargs:
            v = kwargs.pop(k)
            default = "dataset.yaml" if k == "dataset_config" else "split.yaml"
            if v != default:
                _refuse(k, f"{v!r}: zephon's reader reads .nv-meta/{default} only")

    subflavors = kwargs.pop("subflavors", None)
    if subflavors is not None and not isinstance(subflavors, dict):
        raise ValueError(f"subflavors must be a dict, got {type(subflavors).__name__}")
    if kwargs:
        _refuse(", ".join(sorted(kwargs)), "not an Energon keyword zephon_energon can honour "
                f"(Zephon extras: {', '.join(ZEPHON_KEYWORDS)})")
    if overridden(task_encoder, "batch_group_criterion"):
        _refuse("task_encoder.batch_group_criterion", "grouped batching (GroupBatchDataset) is not supported: batches "
                "are batch_size rows of one lane")

    sources = _open_sources(path, split_part, {}) if entries is None else entries
    if subflavors:  # Energon: the keyword merge-overrides the (meta)dataset's subflavors of every sample
        sources = [(ds, dict(e, subflavors={**(e.get("subflavors") or {}), **subflavors})) for ds, e in sources]
    datasets, weights, metas = _weights(sources, repeat)
    factories = [SampleFactory(e["path"], getattr(ds, "energon", {}) or {}, e.get("subflavors"))
                 for ds, e in zip(datasets, metas)]
    seed = int(getattr(worker_config, "seed_offset", 0) or 0)
    handler = _handler(worker_config)
    ops = [EncodeSamples(factories, task_encoder, postencode=packing_buffer_size is None, seed_offset=seed,
                         error_handler=handler),
           Filter(keep, name="zephon_energon.skipped")]
    if training and shuffle_buffer_size is not None and shuffle_buffer_size > 1:
        ops.append(Shuffle(int(shuffle_buffer_size), seed=seed))
    if packing_buffer_size is not None:
        ops.append(TaskPack(task_encoder, packing_buffer_size, seed_offset=seed, error_handler=handler))
    ops.append(Batch(batch_size or 1, drop_last=bool(batch_drop_last)))

    total = sum(d.num_samples for d in datasets)
    if training:
        R = int(zk.get("canonical_replicas", DEFAULT_CANONICAL_REPLICAS))
        chunk = int(zk.get("chunk_size") or max(1, min(256, total // R)))
        assignment = zk.get("lane_assignment", "contiguous")
    else:
        # Validation restarts every iteration: no lanes need to outlive a run. Energon splits the split into
        # world_size x num_workers near-equal slices (one per rank-worker); one lane per rank-worker, samples
        # dealt one at a time (chunk_size 1) and lanes interleaved over ranks give every lane Energon's slice
        # size (q or q + 1 samples), so batches are full and ranks' batch counts as balanced as Energon's.
        R = int(zk.get("canonical_replicas") or worker_config.world_size * max(1, worker_config.num_workers))
        chunk = int(zk.get("chunk_size") or 1)
        assignment = zk.get("lane_assignment", "interleaved")
    span = int(zk.get("flush_span") or max(256, 4 * (packing_buffer_size or 0), 4 * (shuffle_buffer_size or 0)))
    k = -(-span // chunk)  # whole chunks between sentinels
    loader_kwargs = dict(seed=seed, canonical_replicas=R, chunk_size=chunk, flush_every_k_chunks=k,
                         shuffle=training, exhaustion="repeat" if (training and repeat) else "stop",
                         dp_degree=worker_config.world_size, dp_rank=worker_config.rank,
                         lane_assignment=assignment)
    ds = EnergonDataset(datasets=datasets, weights=weights, ops=ops, loader_kwargs=loader_kwargs,
                        worker_config=worker_config, task_encoder=task_encoder, batch_size=batch_size,
                        training=training, virtual_epoch_length=virtual_epoch_length, limit=limit,
                        seed_offset=seed, sources=[e for _, e in sources])
    _check_lanes(ds, path, total, batch_size, explicit_replicas="canonical_replicas" in zk)
    return ds


def _check_lanes(ds, path, total, batch_size, explicit_replicas) -> None:
    """A dataset (pass) too small for its lanes must not go unnoticed: empty lanes put one sample twice in a
    batch (``repeat``) or leave ranks without data (one pass: their collectives would wait forever)."""
    L, wc = ds.loader, ds.worker_config
    R, src, W = L.canonical_replicas, L.source, wc.world_size
    finite = src.total_positions is not None
    n = src.total_positions if finite else total
    per_lane = [src.lane_positions(lane) for lane in range(R)] if finite else None
    idle = [r for r in range(W) if not any(per_lane[lane] for lane in lanes_for_rank(
        R, W, r, ds._kwargs["lane_assignment"]))] if finite else []
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


def _deprecated(kwargs, task_encoder) -> None:
    """Energon's deprecated keywords, handled as Energon 7.4 does: ``handler`` is ignored with a warning;
    ``auto_decode=False`` drops the decoder; ``image_decode``/``av_decode``/``video_decode_audio`` set a
    ``SampleDecoder`` on the task encoder (refused if it already has a different one)."""
    if "handler" in kwargs:
        kwargs.pop("handler")
        warnings.warn("handler is deprecated in Energon and ignored (as Energon does): errors in TaskEncoder hooks go "
                      "to worker_config.global_error_handler", DeprecationWarning, stacklevel=4)
    from megatron.energon.task_encoder.loader import _split_deprecated_dataset_kwargs

    dec = {k: kwargs.pop(k) for k in ("auto_decode", "image_decode", "av_decode", "video_decode_audio")
           if k in kwargs}
    _split_deprecated_dataset_kwargs(dec, task_encoder, None)


def get_train_dataset(path, *, split_part="train", worker_config, batch_size, batch_drop_last: bool = False,
                      packing_buffer_size=None, shuffle_buffer_size, max_samples_per_sequence,
                      virtual_epoch_length: int = 0, shuffle_over_epochs_multiplier=1, task_encoder=None,
                      repeat: bool = True, **kwargs) -> EnergonDataset:
    """Energon's ``get_train_dataset`` on Zephon lanes (same keywords; see docs/energon.md).

    ``max_samples_per_sequence`` is accepted and has no effect: Zephon reads samples by random access
    (``.tar.idx``) in its own permutation, so there are no sequential runs to bound.
    ``shuffle_over_epochs_multiplier`` must be 1 (or None): every pass visits every sample once.
    Zephon extras: ``canonical_replicas`` (lanes, default 64; every world size used must divide it),
    ``chunk_size`` (default ``min(256, samples // canonical_replicas)``), ``flush_span`` (pointers per
    lane between accumulator flushes, default ``max(256, 4 x buffer sizes)``), ``lane_assignment``.
    Raises ``RefusedKeyword`` for a keyword it cannot honour, ``TopologyError`` when ``world_size`` does
    not divide ``canonical_replicas``."""
    if shuffle_over_epochs_multiplier not in (None, 1):
        _refuse("shuffle_over_epochs_multiplier", f"{shuffle_over_epochs_multiplier}: Zephon visits every sample "
                f"exactly once per pass (multiplier 1)")
    if not isinstance(virtual_epoch_length, int) or virtual_epoch_length < 0:
        raise ValueError(f"virtual_epoch_length must be an int >= 0, got {virtual_epoch_length!r}")
    return _build(path, split_part=split_part, worker_config=worker_config, batch_size=batch_size,
                  batch_drop_last=batch_drop_last, packing_buffer_size=packing_buffer_size,
                  shuffle_buffer_size=shuffle_buffer_size, task_encoder=task_encoder, repeat=repeat, training=True,
                  virtual_epoch_length=virtual_epoch_length, kwargs=dict(kwargs))


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
