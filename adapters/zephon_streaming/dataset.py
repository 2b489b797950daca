"""``StreamingDataset`` with mosaicml-streaming 0.13's keyword names, on ``zephon.Loader`` through ``zephon.host``.

Translation only: lanes, order, replay, worker shares, reassembly and checkpoints are the core's. This module maps
Mosaic's constructor onto a core config (keywords: ``keywords.py``); ``state.py`` holds the epochs and Composer's
state calls, ``iteration.py`` the samples. See docs/streaming.md.
"""
from __future__ import annotations

import hashlib
import os
import shutil
import warnings
import weakref

from torch.utils.data import IterableDataset

from zephon import LoaderPlan
from zephon.formats import UnsafeDataError
from zephon.host import Channel, RankSession, SampleItems, explain, private_dir
from zephon.ops import Batch, Decode, Pack, Tokenize
from zephon.work import Schedule, TopologyError, epoch_steps, lanes_for_rank

from .iteration import RankIteration
from .keywords import RefusedKeyword, Stream, batching_choose, detect_world, refuse_unsupported, stream_weights
from .state import STATE_FORMAT, MosaicState

__all__ = ["STATE_FORMAT", "RefusedKeyword", "Stream", "StreamingDataset", "detect_world"]  # the old home of each


class StreamingDataset(MosaicState, RankIteration, IterableDataset):
    """Drop-in for ``streaming.StreamingDataset`` with Zephon's elastic, deterministic order.

    Mosaic keywords (see docs/streaming.md for each one's status): ``streams``, ``remote``, ``local``,
    ``split``, ``validate_hash``, ``allow_unsafe_types`` (MDS reader), ``epoch_size``, ``batch_size``
    (per device, required), ``num_canonical_nodes`` (= lanes, Zephon's ``canonical_replicas``;
    default: the global batch size), ``shuffle``, ``shuffle_seed``, ``shuffle_block_size``,
    ``replication``; for a ``remote`` object-storage URL read through ``local`` (docs/remote.md):
    ``download_retry``, ``download_timeout``, ``keep_zip``, ``predownload``, ``cache_limit``;
    ``batching_method`` (``random``, ``stratified``, ``per_stream``, ``device_per_stream``: Mosaic's
    composition per global step, defined per lane step rather than per physical device; not with
    ``tokenizer``); ``sampling_method`` (``balanced``; ``fixed`` with ``shuffle=False`` only); refused unless
    left at Mosaic's default: ``sampling_granularity``, ``partition_algo``, ``shuffle_algo``,
    ``stream_name``, ``stream_config``.

    Zephon keywords: ``tokenizer`` (a ``tokenizers.Tokenizer`` or tokenizer.json path: tokenize
    ``text_column`` and pack into rows of ``max_seq_len`` tokens; ``eos_id`` appended per document;
    needs ``epoch_size`` = packed rows per epoch), ``packing`` (``"best_fit"``, ``"first_fit"`` or ``"concat"``:
    documents end to end cut into rows, no padding, as llm-foundry's ``concat_tokens``), ``chunk_size``
    (pointers per chunk; a one-pass
    epoch drops at most ``num_canonical_nodes x chunk_size + global batch`` samples at its end),
    ``runner`` / ``num_threads`` (the core runner inside each process; default None / None: one thread
    that reads ahead, ``zephon.host.workers.HOST_WORKER_RUNNER``; ``"inline"`` computes only when asked),
    ``aggregate_dir`` /
    ``run_id`` (a shared directory to merge ranks' lanes in ``state_dict`` when torch.distributed is
    not initialised), ``state_timeout`` (seconds ``state_dict`` waits for a worker's entry, and rank 0 for
    the other ranks; default 60, then a ``LookupError`` / timeout error naming what did not arrive),
    ``channel_dir`` (where the private directory of the side channel and the workers' step exchange lives;
    default ``/dev/shm`` when it has room, else the system temp dir), ``exchange_timeout`` (seconds a DataLoader
    worker waits for another worker that is computing lanes of the step it yields; waits on the training loop's
    pace never time out).

    Iterating yields one sample dict (decoded columns) at a time: per global step, this rank's
    ``batch_size`` rows (its lanes in order), so a DataLoader with ``batch_size=batch_size`` gets
    exactly one rank batch per step, whatever its ``num_workers`` (each worker computes only its share of
    the lanes; ``in_order=False`` keeps every batch whole but not in step order). ``len()`` is the per-rank
    sample count of an epoch, the same on every rank. Each ``__iter__`` is the next epoch; a state passed to
    ``load_state_dict`` is used by the next ``__iter__`` only. Raises ``RefusedKeyword`` (a ValueError) for
    knobs Zephon does not honour, ValueError / ``TopologyError`` for inconsistent values.
    """

    def __init__(self, *, streams=None, remote=None, local=None, split=None, download_retry=2,
                 download_timeout=60, validate_hash=None, keep_zip=False, epoch_size=None, predownload=None,
                 cache_limit=None, sampling_method="balanced", sampling_granularity=1, partition_algo="relaxed",
                 num_canonical_nodes=None, batch_size=None, shuffle=False, shuffle_algo="py1e", shuffle_seed=9176,
                 shuffle_block_size=None, batching_method="random", allow_unsafe_types=False, replication=None,
                 stream_name="stream", stream_config=None,
                 tokenizer=None, text_column="text", max_seq_len=2048, eos_id=None, packing="best_fit",
                 chunk_size=64,
                 runner=None, num_threads=None, aggregate_dir=None, run_id=None, state_timeout=60.0,
                 channel_dir=None, exchange_timeout=300.0):
        refuse_unsupported(sampling_method=sampling_method, sampling_granularity=sampling_granularity,
                           partition_algo=partition_algo, shuffle_algo=shuffle_algo, batching_method=batching_method,
                           stream_name=stream_name, stream_config=stream_config, shuffle=shuffle,
                           tokenizer=tokenizer, streams=streams or ())
        if batch_size is None:
            raise RefusedKeyword("batch_size=None is not supported by zephon_streaming: the per-device batch_size is "
                                 "required, because batch_size x world_size is the global batch that stays identical "
                                 "across resumes at other world sizes")
        if not isinstance(batch_size, int) or isinstance(batch_size, bool) or batch_size < 1:
            raise ValueError(f"batch_size must be an int >= 1, got {batch_size!r}")
        if shuffle_seed is None or shuffle_seed < 0:
            raise ValueError(f"shuffle_seed must be a non-negative integer, got {shuffle_seed!r}")
        if bool(streams) == bool(remote or local):
            raise ValueError("You must provide either `streams` or `remote`/`local`, but not both.")
        if shuffle_block_size is not None and (not isinstance(shuffle_block_size, int) or shuffle_block_size < 1):
            raise ValueError(f"shuffle_block_size must be an int >= 1 or None, got {shuffle_block_size!r}")

        # Remote streams read through local with these (docs/remote.md); local directories ignore them.
        self.predownload, self.cache_limit = predownload, cache_limit
        default = {"remote": remote, "local": local, "split": split, "download_retry": download_retry,
                   "download_timeout": download_timeout, "validate_hash": validate_hash, "keep_zip": keep_zip}
        if streams:
            streams = list(streams)
            for s in streams:
                if not isinstance(s, Stream):
                    raise TypeError(f"streams must be zephon_streaming.Stream objects, got {type(s).__name__} "
                                    f"(a streaming.Stream carries the same keywords: rebuild it with "
                                    f"zephon_streaming.Stream(...))")
                s.apply_default(default)
        else:
            streams = [Stream(**default)]
        self.streams = streams
        self.allow_unsafe_types = allow_unsafe_types
        self._datasets = [self._open(s) for s in streams]
        self.samples_per_stream = [d.num_samples for d in self._datasets]
        self.num_samples = sum(self.samples_per_stream)
        self._items, self._item_hook = SampleItems(self._datasets), self._overrides_getitem(tokenizer)

        # -- weights and epoch
        self.weights, epoch_value, one_pass = stream_weights(streams, self.samples_per_stream, epoch_size)
        self.text = tokenizer is not None
        if self.text and epoch_value is None:
            raise ValueError("tokenizer= (packing) needs epoch_size = packed rows per epoch: the number of rows a "
                             "pass packs into is unknown until every document is tokenized")
        one_pass = one_pass and not self.text
        self.batching_method = batching_method
        one_pass, epoch_value = self._batching_epoch(streams, epoch_value, one_pass)
        self.exhaustion = "fill" if one_pass else "repeat"  # one pass: Mosaic's epoch, the last batch filled
        self.epoch_size = None if one_pass else (epoch_value or (self.num_samples if isinstance(self.weights, Schedule)
                                                                 else int(round(sum(self.weights)))))

        # -- topology
        if replication is not None and (not isinstance(replication, int) or replication < 1):
            raise ValueError(f"replication must be an int >= 1 or None, got {replication!r}")
        self.replication = replication
        self.rank, self.world_size = detect_world()
        rep = replication or 1
        if self.world_size % rep:
            raise ValueError(f"replication={rep} does not divide WORLD_SIZE={self.world_size}")
        self.dp_degree, self.dp_rank = self.world_size // rep, self.rank // rep
        self.batch_size = batch_size
        self.global_batch_size = batch_size * self.dp_degree
        self.shuffle, self.shuffle_seed, self.shuffle_block_size = bool(shuffle), int(shuffle_seed), shuffle_block_size
        self.chunk_size = chunk_size
        self.tokenizer, self.text_column, self.max_seq_len, self.eos_id = tokenizer, text_column, max_seq_len, eos_id
        self.packing = packing
        self.runner, self.num_threads = runner, num_threads
        self.aggregate_dir = aggregate_dir if aggregate_dir is not None else os.environ.get("ZEPHON_AGGREGATE_DIR")
        self.run_id = run_id
        self.state_timeout, self.exchange_timeout = state_timeout, exchange_timeout
        self._ops_cache = None
        self._lanes_given = num_canonical_nodes is not None
        self._configure(num_canonical_nodes)

        # -- side channel and step exchange, private to this object and the worker processes it spawns
        root = private_dir("zephon-streaming-", channel_dir)
        self._channel = Channel(root)
        self._iter_count = 0
        self._owner_pid = os.getpid()
        weakref.finalize(self, _remove_dir, root, self._owner_pid)

    # -- configuration ------------------------------------------------------------------------------
    def _configure(self, num_canonical_nodes) -> None:
        gbs = self.global_batch_size
        R = gbs if num_canonical_nodes is None else num_canonical_nodes
        if not isinstance(R, int) or isinstance(R, bool) or R < 1:
            raise ValueError(f"num_canonical_nodes must be an int >= 1 or None, got {num_canonical_nodes!r}")
        if R % self.dp_degree and self.dp_degree % R:
            raise TopologyError(f"num_canonical_nodes={R} lanes cannot be split evenly over {self.dp_degree} data-"
                                f"parallel ranks (WORLD_SIZE={self.world_size}, replication={self.replication}); "
                                f"choose num_canonical_nodes as a multiple of every world size you will run at, or "
                                f"a divisor of it (ranks then share a lane, each taking its block of the lane's "
                                f"step)")
        per_rank = max(1, R // self.dp_degree)
        if self.batch_size % per_rank:
            raise ValueError(f"batch_size={self.batch_size} must be a multiple of the {per_rank} lanes each rank owns "
                             f"(num_canonical_nodes={R} / {self.dp_degree} ranks): every lane gives the same rows "
                             f"per step")
        self.num_canonical_nodes = R
        self.rows_per_lane_step = gbs // R
        self.rank_lanes = lanes_for_rank(R, self.dp_degree, self.dp_rank)
        if self.batching_method == "device_per_stream" and per_rank > 1:
            warnings.warn(f"batching_method='device_per_stream' is honoured per lane step: this rank owns {per_rank} "
                          f"lanes, so its batch of {self.batch_size} rows is {per_rank} lane steps of "
                          f"{self.rows_per_lane_step} rows, each from one stream; set num_canonical_nodes to the "
                          f"world size ({self.dp_degree}) for one stream per device batch (docs/streaming.md)",
                          stacklevel=3)
        self._plans = {}
        self.steps_per_epoch = self._steps()
        self.length = self.steps_per_epoch * self.batch_size
        ref = self._plan(0)
        self.fingerprint, self.config_summary = ref.fingerprint, ref.summary

    def _batching_epoch(self, streams, epoch_value, one_pass):
        """``(one_pass, epoch_value)`` for ``batching_method``: unchanged for ``random``; else an epoch of whole
        steps of each stream's samples (``zephon.work.epoch_steps``, from ``_choose`` set here)."""
        if self.batching_method == "random":
            return one_pass, epoch_value
        self._choose, self._proportions = batching_choose(streams, self.weights, self.samples_per_stream,
                                                          epoch_value, one_pass)
        return False, sum(self._choose)

    def _overrides_getitem(self, tokenizer) -> bool:
        """Whether a subclass's ``__getitem__`` (llm-foundry's ``StreamingTextDataset``) shapes every delivered sample,
        as in Mosaic. tokenizer: Zephon's ``tokenizer=``. Raises ValueError for both together (a packed row has no
        single sample to hand the override)."""
        hook = type(self).__getitem__ is not StreamingDataset.__getitem__
        if hook and tokenizer is not None:
            raise ValueError(f"{type(self).__name__} overrides __getitem__, which sees one source sample, but "
                             f"tokenizer= packs several documents into each row; tokenize in __getitem__ (and leave "
                             f"tokenizer=None) or drop the override")
        return hook

    def _open(self, stream: Stream):
        try:
            return stream.open(allow_unsafe_types=self.allow_unsafe_types, predownload=self.predownload,
                               cache_limit=self.cache_limit)
        except UnsafeDataError as e:  # allow_unsafe_types is this class's own keyword: name it, not open_dataset
            raise e.opened_by(type(self).__name__) from None

    def _ops(self):
        if self._ops_cache is None:
            ops = []
            if self.text:
                tok = Tokenize(self.tokenizer, field=self.text_column, eos_id=self.eos_id,
                               add_eos=self.eos_id is not None,
                               max_length=None if self.packing == "concat" else self.max_seq_len)
                ops = [Decode(self.text_column), tok, Pack(self.max_seq_len, method=self.packing)]
            self._ops_cache = ops
        return list(self._ops_cache)

    def _epoch_seed(self, epoch: int) -> int:
        if not self.shuffle:
            return self.shuffle_seed
        h = hashlib.sha256(f"zephon-streaming:{self.shuffle_seed}:{epoch}".encode()).digest()
        return int.from_bytes(h[:7], "little")

    def _plan(self, epoch: int) -> LoaderPlan:
        """The core loader plan of ``epoch`` for this rank (the last one built is cached)."""
        if epoch in self._plans:
            return self._plans[epoch]
        weights = self.weights.shifted(epoch * self._steps()) if isinstance(self.weights, Schedule) else \
            self._batch_weights if self.batching_method != "random" else self.weights
        # a lane's step is one micro-batch; ranks sharing a lane (more ranks than lanes) take one block of it each
        micro = min(self.rows_per_lane_step, self.batch_size)
        plan = LoaderPlan.build(self._datasets, self._ops() + [Batch(micro, drop_last=True)],
                                weights=weights, seed=self._epoch_seed(epoch),
                                canonical_replicas=self.num_canonical_nodes, chunk_size=self.chunk_size,
                                global_batch_size=self.global_batch_size, shuffle=self.shuffle,
                                shuffle_block_size=self.shuffle_block_size, exhaustion=self.exhaustion,
                                dp_degree=self.dp_degree, dp_rank=self.dp_rank, batching=self.batching_method,
                                step_major=self.exhaustion == "repeat")  # an epoch is the stream's first steps
        self._plans = {epoch: plan}
        return plan

    def _session(self, epoch: int, start=None) -> RankSession:
        """The rank's host session of ``epoch`` from ``start`` (a rank or merged checkpoint; None: the epoch's
        beginning). The step count is Mosaic's epoch, the same on every rank, so no end-of-stream vote is taken.
        Raises ``CheckpointError`` for a ``start`` that does not restore."""
        session = RankSession(self._plan(epoch), agree_end=False)
        if start is not None:
            session.load(start)
        return session

    def _steps(self) -> int:
        """Global steps per epoch: equal on every rank, whatever the world size."""
        gbs, R = self.global_batch_size, self.num_canonical_nodes
        if self.batching_method != "random":  # Mosaic drops each stream's incomplete batches
            S, self._batch_weights = epoch_steps(self.batching_method, self._choose, self._proportions,
                                                 step_size=gbs, canonical_replicas=R)
            what = f"batching_method={self.batching_method!r} over {self._choose} samples per stream"
        elif self.exhaustion == "repeat":
            S = self.epoch_size // gbs
            what = f"epoch_size={self.epoch_size}"
        else:  # one pass, filled to whole global batches: every lane holds exactly S steps of samples
            src = self._plan(0).source
            S = src.total_positions // gbs
            what = f"one pass over {src.pass_positions} samples"
        if S < 1:
            raise ValueError(f"{what} gives no complete global batch of {gbs} rows over {R} lanes "
                             f"(lower num_canonical_nodes or chunk_size, or raise epoch_size)")
        return S

    # -- Mosaic surface -----------------------------------------------------------------------------
    def explain(self, steps, epoch: int = 0, text_field=None) -> dict:
        """Every row of the global batches of ``steps`` of epoch ``epoch`` (``zephon.engine.explain.explain`` on
        that epoch's plan; steps count from the epoch's start)."""
        return explain(self._plan(epoch), steps, text_field=text_field)

    def __len__(self) -> int:
        """Samples this rank yields per epoch: ``steps_per_epoch x batch_size``, equal on every rank."""
        return self.length

    def __getitem__(self, idx: int) -> dict:
        """Source sample ``idx`` (Mosaic's global sample id: streams, then shards, concatenated in order) as a dict
        of its columns. A subclass may override it and call ``super().__getitem__(idx)``: iteration then yields
        what the override returns for each sample, in Zephon's order (the sample being delivered is not read
        twice). Raises IndexError for an id out of range, the reader's DataError for bad data."""
        return self._items.get(idx)

    @property
    def size(self) -> int:
        """Samples in the underlying streams (one pass)."""
        return self.num_samples

    @property
    def dropped_per_epoch(self) -> int:
        """Samples of an epoch left out: 0 for ``batching_method="random"`` (a one-pass epoch is filled to whole
        global batches instead, see ``repeated_per_epoch``); else the samples of each stream's epoch that do not
        fill a whole step of its own (Mosaic drops them too)."""
        if self.batching_method == "random":
            return 0
        return sum(self._choose) - self.steps_per_epoch * self.global_batch_size

    @property
    def repeated_per_epoch(self) -> int:
        """Samples a one-pass epoch delivers twice: its last global batch is filled with samples from the start
        of the epoch's order, as Mosaic does (fewer than ``batch_size x world size``; 0 when ``epoch_size``
        fixes the epoch). Counted in ``len()``."""
        if self.exhaustion == "repeat":
            return 0
        return self._plan(0).source.fill_positions

    def __getstate__(self):  # spawned workers: no cached plans
        state = dict(self.__dict__)
        state["_plans"] = {}
        return state

    def close(self) -> None:
        """Remove the private directory (side channel, step exchange); only the process that made it does."""
        _remove_dir(self._channel.root, self._owner_pid)


def _remove_dir(root: str, owner_pid: int) -> None:
    if os.getpid() == owner_pid:
        shutil.rmtree(root, ignore_errors=True)
