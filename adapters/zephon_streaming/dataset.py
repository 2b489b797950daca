"""``StreamingDataset`` and ``Stream`` with mosaicml-streaming 0.13's keyword names, on ``zephon.Loader``.

Translation only: lanes, order, replay and checkpoints are the core's. What this module adds is the
Mosaic host semantics: per-device ``batch_size``, epochs (each ``__iter__`` is the next one), the
Composer state calls, rank/world from the environment, samples as dicts of columns.
"""
from __future__ import annotations

import hashlib
import math
import os
import shutil
import tempfile
import uuid
import weakref

import numpy as np
from torch.utils.data import IterableDataset, get_worker_info

from zephon.engine import Loader, checkpoint as ckpt
from zephon.formats import open_dataset
from zephon.ops import Batch, Decode, Pack, Tokenize
from zephon.work import lanes_for_rank
from zephon.work.lanes import TopologyError

from ._channel import Channel

STATE_FORMAT = "zephon-streaming/1"
REMOTE_SCHEMES = ("s3://", "gs://", "oci://", "azure://", "az://", "hf://", "dbfs:", "sftp://", "http://", "https://")


class RefusedKeyword(ValueError):
    """A mosaicml-streaming keyword (or value) Zephon does not honour; the message says why and what to use."""


def _refuse(name, value, why):
    raise RefusedKeyword(f"{name}={value!r} is not supported by zephon_streaming: {why}")


def _abbrev_to_int(v) -> int:
    """Mosaic's epoch size notation: an int or '10k' / '2.5m' / '1b' / '1t'."""
    if isinstance(v, bool):
        raise ValueError(f"epoch_size must be an int or a string like '10k', got {v!r}")
    if isinstance(v, (int, float)):
        return int(v)
    s = str(v).strip().lower()
    units = {"k": 10**3, "m": 10**6, "b": 10**9, "t": 10**12}
    try:
        if s and s[-1] in units:
            return int(float(s[:-1]) * units[s[-1]])
        return int(s)
    except ValueError:
        raise ValueError(f"epoch_size={v!r}: expected an int or a number with suffix k, m, b or t") from None


def detect_world():
    """``(rank, world_size)``: torch.distributed if initialised, else ``RANK`` / ``WORLD_SIZE``
    (``LOCAL_WORLD_SIZE`` is checked to divide the world size, as Mosaic does)."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    rank = int(os.environ.get("RANK", 0))
    world = int(os.environ.get("WORLD_SIZE", 1))
    local = int(os.environ.get("LOCAL_WORLD_SIZE", world))
    if not 0 <= rank < world or local < 1 or world % local:
        raise ValueError(f"inconsistent environment: RANK={rank}, WORLD_SIZE={world}, LOCAL_WORLD_SIZE={local}")
    return rank, world


class Stream:
    """One data source, as ``streaming.Stream``: ``remote`` / ``local`` / ``split`` locate the shards
    (MDS ``index.json``, or JSONL / Parquet files); at most one of ``proportion`` (relative),
    ``repeat`` (samples per epoch = repeat x stream size) or ``choose`` (samples per epoch) sets its
    mixture weight. ``validate_hash`` is passed to the MDS reader; ``download_retry``,
    ``download_timeout`` and ``keep_zip`` have no effect (Zephon reads shards in place, it never
    downloads or unzips to a cache)."""

    def __init__(self, *, remote=None, local=None, split=None, proportion=None, repeat=None, choose=None,
                 download_retry=None, download_timeout=None, validate_hash=None, keep_zip=None):
        given = [n for n, v in (("proportion", proportion), ("repeat", repeat), ("choose", choose)) if v is not None]
        if len(given) > 1:
            raise ValueError(f"Stream: at most one of proportion, repeat and choose may be given, got {given}")
        for n, v in (("proportion", proportion), ("repeat", repeat), ("choose", choose)):
            if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v <= 0):
                raise ValueError(f"Stream: {n} must be a finite number > 0, got {v!r} (a stream that contributes "
                                 f"nothing should be left out)")
        if choose is not None and int(choose) != choose:
            raise ValueError(f"Stream: choose must be a whole number of samples, got {choose!r}")
        self.remote, self.local, self.split = remote, local, split
        self.proportion, self.repeat, self.choose = proportion, repeat, choose
        self.download_retry, self.download_timeout = download_retry, download_timeout
        self.validate_hash, self.keep_zip = validate_hash, keep_zip

    def apply_default(self, default: dict) -> None:
        for k, v in default.items():
            if getattr(self, k, None) is None:
                setattr(self, k, v)

    def __repr__(self):
        return (f"Stream(remote={self.remote!r}, local={self.local!r}, split={self.split!r}, "
                f"proportion={self.proportion!r}, repeat={self.repeat!r}, choose={self.choose!r})")

    def resolve(self) -> tuple[str, bool]:
        """``(directory, is_mds)``: ``local`` if it holds the shards, else ``remote`` when it is a
        local (or mounted) path. Raises ``RefusedKeyword`` for a remote URL with no local copy."""
        split = self.split or ""
        tried = []
        for base in (self.local, self.remote):
            if base is None:
                continue
            b = os.fspath(base)
            if b.startswith("file://"):
                b = b[len("file://"):]
            if b.startswith(REMOTE_SCHEMES):
                continue
            p = os.path.join(b, split)
            tried.append(p)
            if os.path.isdir(p) and any(not n.startswith(".") for n in os.listdir(p)):
                return p, os.path.exists(os.path.join(p, "index.json"))
            if os.path.isfile(p):
                return p, False
        if self.remote is not None and str(self.remote).startswith(REMOTE_SCHEMES):
            _refuse("remote", self.remote, "Zephon reads shards in place and never downloads. Copy the shards to a "
                    "local or mounted directory (e.g. `aws s3 sync`, or a streaming.StreamingDataset run with "
                    f"local=<dir>) and pass local=<dir>; local={self.local!r} holds no shards")
        raise FileNotFoundError(f"{self!r}: no shards found (looked in {tried or 'nothing: give local= or remote='})")


class StreamingDataset(IterableDataset):
    """Drop-in for ``streaming.StreamingDataset`` with Zephon's elastic, deterministic order.

    Mosaic keywords (see docs/streaming.md for each one's status): ``streams``, ``remote``, ``local``,
    ``split``, ``validate_hash``, ``allow_unsafe_types`` (MDS reader), ``epoch_size``, ``batch_size``
    (per device, required), ``num_canonical_nodes`` (= lanes, Zephon's ``canonical_replicas``;
    default: the global batch size), ``shuffle``, ``shuffle_seed``, ``shuffle_block_size``,
    ``replication``; accepted without effect: ``download_retry``, ``download_timeout``, ``keep_zip``,
    ``predownload``, ``cache_limit``; refused unless left at Mosaic's default: ``sampling_method``,
    ``sampling_granularity``, ``partition_algo``, ``shuffle_algo``, ``batching_method``,
    ``stream_name``, ``stream_config``.

    Zephon keywords: ``tokenizer`` (a ``tokenizers.Tokenizer`` or tokenizer.json path: tokenize
    ``text_column`` and pack into rows of ``max_seq_len`` tokens; ``eos_id`` appended per document;
    needs ``epoch_size`` = packed rows per epoch), ``chunk_size`` (pointers per chunk; a one-pass
    epoch drops at most ``num_canonical_nodes x chunk_size + global batch`` samples at its end),
    ``runner`` / ``num_threads`` (the core runner inside each process), ``aggregate_dir`` /
    ``run_id`` (a shared directory to merge ranks' lanes in ``state_dict`` when torch.distributed is
    not initialised), ``state_timeout`` (seconds ``state_dict`` waits for a worker's entry),
    ``channel_dir`` (where the per-process side channel lives; default the system temp dir).

    Iterating yields one sample dict (decoded columns) at a time: per global step, this rank's
    ``batch_size`` rows (its lanes in order), so a DataLoader with ``batch_size=batch_size`` gets
    exactly one rank batch per step. ``len()`` is the per-rank sample count of an epoch, the same on
    every rank. Each ``__iter__`` is the next epoch; a state passed to ``load_state_dict`` is used by
    the next ``__iter__`` only.
    """

    def __init__(self, *, streams=None, remote=None, local=None, split=None, download_retry=2,
                 download_timeout=60, validate_hash=None, keep_zip=False, epoch_size=None, predownload=None,
                 cache_limit=None, sampling_method="balanced", sampling_granularity=1, partition_algo="relaxed",
                 num_canonical_nodes=None, batch_size=None, shuffle=False, shuffle_algo="py1e", shuffle_seed=9176,
                 shuffle_block_size=None, batching_method="random", allow_unsafe_types=False, replication=None,
                 stream_name="stream", stream_config=None,
                 tokenizer=None, text_column="text", max_seq_len=2048, eos_id=None, chunk_size=64,
                 runner="inline", num_threads=2, aggregate_dir=None, run_id=None, state_timeout=60.0,
                 channel_dir=None):
        # -- refused keywords: Mosaic knobs whose non-default values would change semantics we do not have
        if sampling_method != "balanced":
            _refuse("sampling_method", sampling_method, "the mixture is Zephon's closed-form allocation (exact per-"
                    "stream counts in every prefix of the stream, a fresh choice of samples each epoch when "
                    "shuffle=True), which is 'balanced'; leave sampling_method at its default")
        if sampling_granularity != 1:
            _refuse("sampling_granularity", sampling_granularity, "streams are interleaved sample by sample by the "
                    "mixture; leave it at 1")
        if partition_algo != "relaxed":
            _refuse("partition_algo", partition_algo, "samples are partitioned by lanes (num_canonical_nodes), which "
                    "every world size dividing them can resume; there is no other partition algorithm")
        if shuffle_algo not in ("py1e", None):
            _refuse("shuffle_algo", shuffle_algo, "Zephon has one shuffle: seeded bijective permutations of the shard "
                    "order and of samples within each shard (or within shuffle_block_size blocks); leave shuffle_algo "
                    "at its default and use shuffle / shuffle_seed / shuffle_block_size")
        if batching_method != "random":
            _refuse("batching_method", batching_method, "a global batch is global_batch_size / num_canonical_nodes "
                    "rows from every lane of the mixed stream; per-stream or stratified batches are not built; use "
                    "Stream(proportion=...) for the mix")
        if stream_name != "stream" or stream_config:
            _refuse("stream_name" if stream_name != "stream" else "stream_config", stream_name if stream_name !=
                    "stream" else stream_config, "custom Stream classes from the registry are not used; pass "
                    "zephon_streaming.Stream objects in streams=")
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

        # -- accepted without effect (documented): download_retry, download_timeout, keep_zip, predownload,
        #    cache_limit. Zephon reads shards in place: nothing is downloaded, unzipped to disk or evicted.
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
            streams = [Stream(remote=remote, local=local, split=split, download_retry=download_retry,
                              download_timeout=download_timeout, validate_hash=validate_hash, keep_zip=keep_zip)]
        self.streams = streams
        self.allow_unsafe_types = allow_unsafe_types
        self._datasets = [self._open(s) for s in streams]
        self.samples_per_stream = [d.num_samples for d in self._datasets]
        self.num_samples = sum(self.samples_per_stream)

        # -- weights and epoch
        kinds = {("proportion" if s.proportion is not None else "repeat" if s.repeat is not None
                  else "choose" if s.choose is not None else None) for s in streams}
        epoch_value = _abbrev_to_int(epoch_size) if epoch_size else None
        if epoch_value is not None and epoch_value < 1:
            raise ValueError(f"epoch_size must be >= 1, got {epoch_size!r}")
        if "proportion" in kinds and kinds != {"proportion"}:
            raise ValueError("Stream weights must be all relative (proportion) or all absolute (repeat / choose / "
                             "unset), as in mosaicml-streaming")
        sizes = self.samples_per_stream
        if kinds == {"proportion"}:
            total = sum(s.proportion for s in streams)
            counts = [s.proportion / total * (epoch_value or self.num_samples) for s in streams]
        elif kinds - {None}:
            if epoch_value is not None:
                raise ValueError("epoch_size cannot be combined with Stream(repeat=...) / Stream(choose=...): those "
                                 "already fix the samples per epoch (mosaicml-streaming refuses it too)")
            counts = [s.choose if s.choose is not None else (s.repeat if s.repeat is not None else 1) * n
                      for s, n in zip(streams, sizes)]
        else:
            counts = [float(n) for n in sizes]
        self.weights = [float(c) for c in counts]
        self.text = tokenizer is not None
        one_pass = kinds <= {None} and epoch_value is None and not self.text
        if self.text and epoch_value is None:
            raise ValueError("tokenizer= (packing) needs epoch_size = packed rows per epoch: the number of rows a "
                             "pass packs into is unknown until every document is tokenized")
        self.exhaustion = "stop" if one_pass else "repeat"
        self.epoch_size = None if one_pass else (epoch_value or int(round(sum(counts))))

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
        self.runner, self.num_threads = runner, num_threads
        self.aggregate_dir = aggregate_dir if aggregate_dir is not None else os.environ.get("ZEPHON_AGGREGATE_DIR")
        self.run_id = run_id
        self.state_timeout = state_timeout
        self._ops_cache = None
        self._lanes_given = num_canonical_nodes is not None
        self._configure(num_canonical_nodes)

        # -- side channel, private to this object and the worker processes it spawns
        root = tempfile.mkdtemp(prefix="zephon-streaming-", dir=channel_dir)
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
        if R % self.dp_degree:
            raise TopologyError(f"num_canonical_nodes={R} lanes cannot be split evenly over {self.dp_degree} data-"
                                f"parallel ranks (WORLD_SIZE={self.world_size}, replication={self.replication}); "
                                f"choose num_canonical_nodes as a multiple of every world size you will run at")
        per_rank = R // self.dp_degree
        if self.batch_size % per_rank:
            raise ValueError(f"batch_size={self.batch_size} must be a multiple of the {per_rank} lanes each rank owns "
                             f"(num_canonical_nodes={R} / {self.dp_degree} ranks): every lane gives the same rows per step")
        self.num_canonical_nodes = R
        self.rows_per_lane = gbs // R
        self.rank_lanes = lanes_for_rank(R, self.dp_degree, self.dp_rank)
        self._loaders = {}
        self.steps_per_epoch = self._steps()
        self.length = self.steps_per_epoch * self.batch_size
        ref = self._loader(0)
        self.fingerprint, self.config_summary = ref.fingerprint, ref.summary

    def _open(self, stream: Stream):
        path, is_mds = stream.resolve()
        if is_mds:
            try:
                return open_dataset(path, format="mds", allow_unsafe_types=self.allow_unsafe_types,
                                    validate_hash=stream.validate_hash)
            except TypeError as e:  # an older core without the MDS reader's keywords
                raise RuntimeError(f"{path} holds MDS shards (index.json) but this zephon has no MDS reader: {e}") from e
        if stream.validate_hash:
            _refuse("validate_hash", stream.validate_hash, f"{path} holds JSONL/Parquet files, which carry no shard "
                    f"hashes; validate_hash applies to MDS shards only")
        return open_dataset(path)

    def _ops(self):
        if self._ops_cache is None:
            ops = []
            if self.text:
                tok = Tokenize(self.tokenizer, field=self.text_column, eos_id=self.eos_id,
                               add_eos=self.eos_id is not None, max_length=self.max_seq_len)
                ops = [Decode(self.text_column), tok, Pack(self.max_seq_len)]
            self._ops_cache = ops
        return list(self._ops_cache)

    def _epoch_seed(self, epoch: int) -> int:
        if not self.shuffle:
            return self.shuffle_seed
        h = hashlib.sha256(f"zephon-streaming:{self.shuffle_seed}:{epoch}".encode()).digest()
        return int.from_bytes(h[:7], "little")

    def _loader(self, epoch: int, lanes=None, emit_state=False) -> Loader:
        """The core loader of ``epoch`` for this rank (or a subset of its lanes)."""
        if lanes is None and not emit_state and epoch in self._loaders:
            return self._loaders[epoch]
        L = Loader(self._datasets, self._ops() + [Batch(self.rows_per_lane, drop_last=True)], weights=self.weights,
                   seed=self._epoch_seed(epoch), canonical_replicas=self.num_canonical_nodes,
                   chunk_size=self.chunk_size, global_batch_size=self.global_batch_size, shuffle=self.shuffle,
                   shuffle_block_size=self.shuffle_block_size, exhaustion=self.exhaustion,
                   dp_degree=self.dp_degree, dp_rank=self.dp_rank, runner=self.runner, num_workers=self.num_threads,
                   lanes=lanes, emit_state=emit_state)
        if lanes is None and not emit_state:
            self._loaders = {epoch: L}
        return L

    def _steps(self) -> int:
        """Global steps per epoch: equal on every rank, whatever the world size."""
        gbs, R = self.global_batch_size, self.num_canonical_nodes
        if self.exhaustion == "repeat":
            S = self.epoch_size // gbs
            what = f"epoch_size={self.epoch_size}"
        else:  # one pass: the lane with the fewest samples decides (each row is one sample)
            src = self._loader(0).source
            S = min(src.lane_positions(lane) for lane in range(R)) // self.rows_per_lane
            what = f"one pass over {src.total_positions} samples"
        if S < 1:
            raise ValueError(f"{what} gives no complete global batch of {gbs} rows over {R} lanes "
                             f"(lower num_canonical_nodes or chunk_size, or raise epoch_size)")
        return S

    # -- Mosaic surface -----------------------------------------------------------------------------
    def __len__(self) -> int:
        """Samples this rank yields per epoch: ``steps_per_epoch x batch_size``, equal on every rank."""
        return self.length

    @property
    def size(self) -> int:
        return self.num_samples

    @property
    def dropped_per_epoch(self) -> int:
        """Samples of a one-pass epoch left out by drop_last (the incomplete last global batch and the
        lanes' uneven tails); 0 when ``epoch_size`` fixes the epoch."""
        if self.exhaustion == "repeat":
            return 0
        return self._loader(0).source.total_positions - self.steps_per_epoch * self.global_batch_size

    @property
    def next_epoch(self) -> int:
        return self._channel.latest()[1]["next_epoch"]

    # -- iteration ----------------------------------------------------------------------------------
    def _make_claim(self, table: dict) -> dict:
        pending = table.get("pending")
        table["pending"] = None
        if pending is None:
            return {"epoch": table["next_epoch"], "start": None, "k0": 0}
        k0 = pending["sample_in_epoch"] // self.global_batch_size
        return {"epoch": pending["epoch"], "start": pending["loader"], "k0": k0}

    def _claim(self, key: str) -> dict:
        return self._channel.claim(key, self._make_claim)

    def __iter__(self):
        info = get_worker_info()
        self._iter_count += 1
        if info is None:
            key, W, w = f"main-{os.getpid()}-{id(self)}-{self._iter_count}", 1, 0
        else:  # workers of one DataLoader iteration share seed - id; persistent workers count their calls
            key, W, w = f"w-{info.seed - info.id}-{self._iter_count}", info.num_workers, info.id
        claim = self._claim(key)
        return self._iter_rank(claim, W, w, in_memory=info is None)

    def _iter_rank(self, claim: dict, W: int, w: int, in_memory: bool = False):
        """All of the rank's lanes; a worker keeps global steps ``(k - k0) % W == w``, so a DataLoader
        with ``batch_size`` = this dataset's collates each rank batch from one worker (duplicated work: every
        worker runs every lane of the rank; ``StreamingDataLoader`` splits lanes instead)."""
        e, k0, S = claim["epoch"], claim["k0"], self.steps_per_epoch
        if k0 >= S:
            return
        L = self._loader(e, emit_state=True)
        if claim["start"] is not None:
            L.restore(claim["start"])
        n_lanes = len(L.lanes)
        it = iter(L)
        try:
            for k in range(k0, S):
                mbs = [next(it) for _ in range(n_lanes)]
                if [mb["__step__"] for mb in mbs] != [k] * n_lanes:
                    raise RuntimeError(f"internal: expected step {k}, got {[mb['__step__'] for mb in mbs]}")
                entries = [mb.pop("__state__") for mb in mbs]
                if (k - k0) % W == w:  # every worker knows these entries; the one yielding step k publishes
                    self._channel.publish(e, k, entries, in_memory=in_memory)
                    for mb in mbs:
                        yield from self.rows(mb)
        finally:
            it.close()
            L.close()

    def _iter_lane_batches(self):
        """For ``StreamingDataLoader``: this worker's share of the lanes (``split_lanes``), one item per
        step: the list of its lanes' micro-batches (each a lane's rows of that step, with ``__state__``).
        One item per step per worker keeps torch's round robin in step order and costs one transfer per
        step, not one per lane; the main process reassembles the rank's batch."""
        from zephon.work import split_lanes

        claim = self._channel.current()
        info = get_worker_info()
        W, w = (info.num_workers, info.id) if info is not None else (1, 0)
        lanes = split_lanes(self.rank_lanes, W, w)
        e, S = claim["epoch"], self.steps_per_epoch
        if not lanes or claim["k0"] >= S:
            return
        L = self._loader(e, lanes=lanes, emit_state=True)
        if claim["start"] is not None:
            L.restore(claim["start"])
        try:
            bundle = []
            for mb in L:
                if bundle and mb["__step__"] != bundle[0]["__step__"]:
                    yield bundle
                    bundle = []
                if mb["__step__"] >= S:
                    break
                bundle.append(mb)
            if bundle:
                yield bundle
        finally:
            L.close()

    def rows(self, mb: dict):
        """Split a lane micro-batch into sample dicts of decoded columns (Mosaic's sample shape)."""
        keys = [k for k in mb if not k.startswith("__") and not (self.text and k in ("cu_seqlens", "num_tokens"))]
        n = len(mb[keys[0]]) if keys else 0
        for i in range(n):
            yield {k: mb[k][i] for k in keys}

    # -- state ----------------------------------------------------------------------------------------
    def state_dict(self, num_samples: int, from_beginning: bool) -> dict:
        """Composer's call: the state after ``num_samples`` samples (global, all ranks) of the current
        epoch; ``from_beginning`` False counts them from where this run resumed. Call it on every rank
        (it merges every rank's lanes: torch.distributed, else ``aggregate_dir``). JSON data; restorable
        at another world size (same global batch) and DataLoader ``num_workers``. At ``num_samples`` 0
        after an epoch was consumed to its end (Composer's end-of-epoch checkpoint) it is the start of the
        next epoch, so the finished epoch is not replayed."""
        gbs, S = self.global_batch_size, self.steps_per_epoch
        if not isinstance(num_samples, int) or num_samples < 0:
            raise ValueError(f"num_samples must be an int >= 0, got {num_samples!r}")
        claim, table = self._channel.latest()
        if claim is None:  # nothing iterated yet: the loaded state (unused) or the start
            if table["pending"] is not None:
                return table["pending"]
            return self._state(table["next_epoch"], 0, None)
        e, k0 = claim["epoch"], claim["k0"]
        if num_samples % gbs:
            raise ValueError(f"num_samples={num_samples} is not a whole number of global batches of {gbs} "
                             f"(batch_size {self.batch_size} x {self.dp_degree} ranks): the state is kept per step")
        c = num_samples // gbs + (0 if from_beginning else k0)
        if c == 0 or (c <= k0 and num_samples == 0):
            if self._channel.has_step(e, S - 1):  # the epoch was consumed to its end: Composer's epoch end
                return self._state(e + 1, 0, None)
            if k0 == 0:
                return self._state(e, 0, None)
            return self._state(e, k0 * gbs, claim["start"])
        if c > S:
            raise ValueError(f"num_samples={num_samples} is past the end of the epoch ({S} steps of {gbs} samples)")
        if c < k0:
            raise ValueError(f"num_samples={num_samples} names step {c}, before step {k0} where this run resumed")
        if c == k0:
            return self._state(e, c * gbs, claim["start"])
        entries = self._channel.entries(e, c - 1, self.state_timeout)
        L = self._loader(e)
        rank_state = ckpt.make_state(L.fingerprint, L.summary, L.canonical_replicas, L.rows_per_step, entries)
        return self._state(e, c * gbs, self._gather(rank_state, f"e{e}-s{c}"))

    def _state(self, epoch: int, sample_in_epoch: int, loader_state) -> dict:
        return {"format": STATE_FORMAT, "epoch": epoch, "sample_in_epoch": sample_in_epoch,
                "num_canonical_nodes": self.num_canonical_nodes, "shuffle_seed": self.shuffle_seed,
                "global_batch_size": self.global_batch_size, "fingerprint": self.fingerprint,
                "config": self.config_summary, "loader": loader_state}

    def _gather(self, rank_state: dict, tag: str) -> dict:
        if self.dp_degree == 1:
            return ckpt.merge_states([rank_state])
        if self.rank % (self.replication or 1):
            # a replica holds the same lanes as the first rank of its group, which contributes them
            rank_state = dict(rank_state, lanes=[], lanes_sha256=ckpt.digest([]))
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            from zephon.dist import gather_checkpoint

            return gather_checkpoint(rank_state, run_id=self.run_id)
        if self.aggregate_dir is None:
            raise RuntimeError(f"state_dict at WORLD_SIZE={self.world_size} needs every rank's lanes: initialise "
                               f"torch.distributed, or pass aggregate_dir= (a directory all ranks share; or "
                               f"$ZEPHON_AGGREGATE_DIR)")
        return _dir_gather(self, rank_state, tag)

    def load_state_dict(self, obj) -> None:
        """Composer's call: validate ``obj`` now (``CheckpointError`` / ``ValueError`` saying what
        differs) and use it for the next ``__iter__`` only."""
        if obj is None:
            return
        if not isinstance(obj, dict) or obj.get("format") != STATE_FORMAT:
            if isinstance(obj, dict) and {"epoch", "sample_in_epoch", "num_canonical_nodes"} <= set(obj):
                raise ckpt.CheckpointError(
                    "this is a mosaicml-streaming state: Zephon's sample order differs from Mosaic's, so a position "
                    "in Mosaic's order cannot be continued exactly; start this dataset fresh (drop the dataset state "
                    "from the checkpoint) or resume with streaming.StreamingDataset")
            raise ckpt.CheckpointError(f"not a zephon_streaming state (format "
                                       f"{obj.get('format') if isinstance(obj, dict) else type(obj).__name__!r}, "
                                       f"expected {STATE_FORMAT!r})")
        diffs = []
        if obj.get("global_batch_size") != self.global_batch_size:
            diffs.append(f"global batch size: state has {obj.get('global_batch_size')}, this run has "
                         f"{self.global_batch_size} (batch_size={self.batch_size} x {self.dp_degree} ranks); at "
                         f"{self.dp_degree} ranks use batch_size={_div(obj.get('global_batch_size'), self.dp_degree)}")
        if obj.get("shuffle_seed") != self.shuffle_seed:
            diffs.append(f"shuffle_seed: state has {obj.get('shuffle_seed')}, this dataset has {self.shuffle_seed}")
        if diffs:
            raise ckpt.CheckpointError("state was made with another config: " + "; ".join(diffs))
        if obj.get("num_canonical_nodes") != self.num_canonical_nodes:
            if self._explicit_lanes():
                raise ckpt.CheckpointError(f"state was made with another config: num_canonical_nodes: state has "
                                           f"{obj.get('num_canonical_nodes')}, this dataset has {self.num_canonical_nodes}")
            self._configure(obj.get("num_canonical_nodes"))  # Mosaic adopts the checkpoint's, so do we
        if obj.get("fingerprint") != self.fingerprint:
            d = ckpt.config_diff(self.config_summary, obj.get("config", {}))
            raise ckpt.CheckpointError("state was made with another config: " +
                                       ("; ".join(d) if d else "fingerprints differ (dataset content or settings)"))
        e, n = obj.get("epoch"), obj.get("sample_in_epoch")
        if not (isinstance(e, int) and e >= 0 and isinstance(n, int) and 0 <= n <= self.length * self.dp_degree
                and n % self.global_batch_size == 0):
            raise ckpt.CheckpointError(f"malformed state: epoch={e!r}, sample_in_epoch={n!r}")
        if obj.get("loader") is not None:
            self._loader(e, emit_state=True).restore(obj["loader"])  # validates now (fingerprint, lanes)
        elif n:
            raise ckpt.CheckpointError(f"malformed state: sample_in_epoch={n} without lane entries")
        self._channel.set_pending(obj)

    def _explicit_lanes(self) -> bool:
        return self._lanes_given

    def __getstate__(self):  # spawned workers: no cached core loaders or aggregators
        state = dict(self.__dict__)
        state["_loaders"] = {}
        state.pop("_aggregator", None)
        return state

    def close(self) -> None:
        _remove_dir(self._channel.root, self._owner_pid)


def _div(a, b):
    return a // b if isinstance(a, int) and a % b == 0 else f"<{a} is not divisible by {b}>"


def _remove_dir(root: str, owner_pid: int) -> None:
    if os.getpid() == owner_pid:
        shutil.rmtree(root, ignore_errors=True)


def _dir_gather(ds: StreamingDataset, rank_state: dict, tag: str) -> dict:
    """Ranks without torch.distributed: a shared directory (``zephon.dist.DirectoryAggregator`` per
    dataset object, rounds named by epoch and step so every rank agrees)."""
    from zephon.dist import DirectoryAggregator

    agg = getattr(ds, "_aggregator", None)
    if agg is None:
        run = ds.run_id or ("zs-" + ds.fingerprint[:16])
        agg = ds._aggregator = DirectoryAggregator(ds.aggregate_dir, run, ds.world_size, timeout=ds.state_timeout)
    return agg.gather(ds.rank, rank_state, tag=tag + "-" + uuid.uuid5(uuid.NAMESPACE_OID, ds.fingerprint).hex[:8])
