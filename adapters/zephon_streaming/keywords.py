"""mosaicml-streaming 0.13's keywords on Zephon: ``Stream``, the refused knobs, stream weights and the world.
Remote streams (``s3://``, ``msc://``, ``gs://``) are read through ``zephon.formats.remote`` (docs/remote.md).

Translation only (see docs/streaming.md for each keyword's status): what Mosaic's keywords mean in Zephon's terms
(mixture weights, samples per epoch, rank and world size), and a clear refusal for the knobs whose non-default
values would change semantics Zephon does not have.
"""
from __future__ import annotations

import math
import os

from zephon.formats.mds import is_mds_source
from zephon.formats.remote import SCHEMES, detection_fetcher, is_remote

REMOTE_SCHEMES = ("s3://", "gs://", "oci://", "azure://", "az://", "hf://", "dbfs:", "sftp://", "http://", "https://")


class RefusedKeyword(ValueError):
    """A mosaicml-streaming keyword (or value) Zephon does not honour; the message says why and what to use."""


def refuse(name, value, why):
    """Raise ``RefusedKeyword`` for keyword ``name`` set to ``value``; ``why``: the reason and what to use."""
    raise RefusedKeyword(f"{name}={value!r} is not supported by zephon_streaming: {why}")


def abbrev_to_int(v) -> int:
    """Mosaic's epoch size notation: an int or '10k' / '2.5m' / '1b' / '1t'. Raises ValueError otherwise."""
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
    (``LOCAL_WORLD_SIZE`` is checked to divide the world size, as Mosaic does). Raises ValueError for an
    inconsistent environment."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    rank = int(os.environ.get("RANK", 0))
    world = int(os.environ.get("WORLD_SIZE", 1))
    local = int(os.environ.get("LOCAL_WORLD_SIZE", world))
    if not 0 <= rank < world or local < 1 or world % local:
        raise ValueError(f"inconsistent environment: RANK={rank}, WORLD_SIZE={world}, LOCAL_WORLD_SIZE={local}")
    return rank, world


def refuse_unsupported(*, sampling_method, sampling_granularity, partition_algo, shuffle_algo, batching_method,
                       stream_name, stream_config, shuffle=False, tokenizer=None, streams=()) -> None:
    """Refuse Mosaic knobs set to values Zephon does not honour (each argument: the keyword's value; ``shuffle``,
    ``tokenizer`` and ``streams`` decide whether ``sampling_method`` / ``batching_method`` can be honoured).
    Raises ``RefusedKeyword`` saying why and what to use instead, ValueError for a value Mosaic rejects too."""
    if sampling_method not in ("balanced", "fixed"):
        raise ValueError(f"Invalid sampling method: {sampling_method!r}. Must be one of `balanced` or `fixed`.")
    if sampling_method == "fixed" and shuffle:
        refuse("sampling_method", sampling_method, "with shuffle=True one seeded permutation per epoch gives both "
               "the order of a stream's samples and, for a stream read partly (proportion / choose / repeat below "
               "a whole pass), which samples are read, so a new order each epoch is a new choice ('balanced'); "
               "keeping the choice while changing the order is not implemented (not an elasticity limit: the "
               "choice never depends on the world size). Use shuffle=False (the same samples in the same order "
               "every epoch, accepted as 'fixed') or sampling_method='balanced'")
    if sampling_granularity != 1:
        refuse("sampling_granularity", sampling_granularity, "streams are interleaved sample by sample by the "
               "mixture; leave it at 1")
    if partition_algo != "relaxed":
        refuse("partition_algo", partition_algo, "samples are partitioned by lanes (num_canonical_nodes), which "
               "every world size dividing them can resume; there is no other partition algorithm")
    if shuffle_algo not in ("py1e", None):
        refuse("shuffle_algo", shuffle_algo, "Zephon has one shuffle: seeded bijective permutations of the shard "
               "order and of samples within each shard (or within shuffle_block_size blocks); leave shuffle_algo "
               "at its default and use shuffle / shuffle_seed / shuffle_block_size")
    from zephon.work import BATCHING_METHODS
    if batching_method not in BATCHING_METHODS:
        raise ValueError(f"Invalid batching method: {batching_method!r}. Must be one of "
                         f"{', '.join(f'`{m}`' for m in BATCHING_METHODS)}.")
    if batching_method != "random" and tokenizer is not None:
        refuse("batching_method", batching_method, "with tokenizer= rows are packed from documents of several "
               "samples, so a row has no single stream; use batching_method='random' with packing")
    if batching_method != "random" and any(getattr(s, "proportion_schedule", None) is not None for s in streams):
        refuse("batching_method", batching_method, "a proportion_schedule changes the shares step by step; "
               "stratified / per-stream batches take fixed shares (use Stream(proportion=...))")
    if stream_name != "stream" or stream_config:
        name, value = ("stream_name", stream_name) if stream_name != "stream" else ("stream_config", stream_config)
        refuse(name, value, "custom Stream classes from the registry are not used; pass zephon_streaming.Stream "
               "objects in streams=")


def batching_choose(streams, weights, sizes, epoch_value, one_pass) -> tuple[list[int], list[float]]:
    """Samples per epoch per stream (ints) and the streams' proportions, for a ``batching_method`` other than
    ``random`` (``zephon.work.epoch_steps`` turns them into whole steps).

    streams: ``Stream`` list. weights: ``stream_weights``' samples per epoch per stream. sizes: samples per
    stream. epoch_value: the explicit ``epoch_size`` (or None). one_pass: no weight and no ``epoch_size`` set.
    Relative weights are cut to ints that sum to the epoch (largest remainders first; Mosaic hands its shortfall
    to random streams); the proportions are Mosaic's: the ``proportion`` values, the stream sizes when only
    ``epoch_size`` is set, else the per-epoch counts."""
    relative = all(s.proportion is not None for s in streams)
    if one_pass:
        choose = [int(n) for n in sizes]
    elif relative or epoch_value is not None:  # shares of the epoch, cut to ints that sum to it
        total = epoch_value if epoch_value is not None else sum(sizes)
        exact = [w / sum(weights) * total for w in weights]
        choose = [int(x) for x in exact]
        by_rest = sorted(range(len(exact)), key=lambda d: (choose[d] - exact[d], d))
        for d in by_rest[:total - sum(choose)]:
            choose[d] += 1
    else:  # Mosaic: int(repeat x size), or choose
        choose = [int(w) for w in weights]
    if relative:
        return choose, [float(s.proportion) for s in streams]
    return choose, [float(c) for c in (sizes if epoch_value is not None else choose)]


def stream_weights(streams, sizes, epoch_size) -> tuple[list[float], int | None, bool]:
    """Mixture weights from Mosaic's per-stream ``proportion`` / ``repeat`` / ``choose``.

    streams: ``Stream`` list. sizes: samples per stream. epoch_size: Mosaic's ``epoch_size`` (int, abbreviated
    string or None). Returns ``(weights, epoch_value, one_pass)``: ``weights`` are samples per epoch per stream,
    ``epoch_value`` the explicit ``epoch_size`` as an int (or None), ``one_pass`` when nothing sets the epoch (a
    single pass over the data). Raises ValueError for mixed relative/absolute weights or
    ``epoch_size`` combined with absolute weights (mosaicml-streaming refuses both too)."""
    if any(getattr(s, "proportion_schedule", None) is not None for s in streams):
        return _scheduled_weights(streams, sizes, epoch_size)
    kinds = {("proportion" if s.proportion is not None else "repeat" if s.repeat is not None
              else "choose" if s.choose is not None else None) for s in streams}
    epoch_value = abbrev_to_int(epoch_size) if epoch_size else None
    if epoch_value is not None and epoch_value < 1:
        raise ValueError(f"epoch_size must be >= 1, got {epoch_size!r}")
    if "proportion" in kinds and kinds != {"proportion"}:
        raise ValueError("Stream weights must be all relative (proportion) or all absolute (repeat / choose / "
                         "unset), as in mosaicml-streaming")
    if kinds == {"proportion"}:
        total = sum(s.proportion for s in streams)
        counts = [s.proportion / total * (epoch_value or sum(sizes)) for s in streams]
    elif kinds - {None}:
        if epoch_value is not None:
            raise ValueError("epoch_size cannot be combined with Stream(repeat=...) / Stream(choose=...): those "
                             "already fix the samples per epoch (mosaicml-streaming refuses it too)")
        counts = [s.choose if s.choose is not None else (s.repeat if s.repeat is not None else 1) * n
                  for s, n in zip(streams, sizes)]
    else:
        counts = [float(n) for n in sizes]
    one_pass = kinds <= {None} and epoch_value is None
    return [float(c) for c in counts], epoch_value, one_pass


def _scheduled_weights(streams, sizes, epoch_size):
    """``stream_weights`` when a stream has ``proportion_schedule``: a ``zephon.work.Schedule`` over the streams
    (a plain ``proportion`` is a constant), an endless stream cut into epochs of ``epoch_size`` samples (the caller
    defaults it to the streams' total)."""
    from zephon.work import Schedule

    if any(s.repeat is not None or s.choose is not None for s in streams):
        raise ValueError("Stream(proportion_schedule=...) is relative: the other streams must use proportion or "
                         "proportion_schedule too, not repeat / choose")
    if any(s.proportion is None and s.proportion_schedule is None for s in streams):
        raise ValueError("with Stream(proportion_schedule=...) every stream needs proportion or proportion_schedule "
                         "(relative weights, as in mosaicml-streaming)")
    epoch_value = abbrev_to_int(epoch_size) if epoch_size else None
    if epoch_value is not None and epoch_value < 1:
        raise ValueError(f"epoch_size must be >= 1, got {epoch_size!r}")
    schedule = Schedule([s.proportion_schedule if s.proportion_schedule is not None else s.proportion
                         for s in streams])
    return schedule, epoch_value, False


class Stream:
    """One data source, as ``streaming.Stream``: ``remote`` / ``local`` / ``split`` locate the shards
    (MDS ``index.json``, or JSONL / Parquet files); at most one of ``proportion`` (relative),
    ``repeat`` (samples per epoch = repeat x stream size) or ``choose`` (samples per epoch) sets its
    mixture weight; Zephon adds ``proportion_schedule``, a relative weight that changes with the global step
    (``{"step": {step: w}}`` or ``{"linear": {step: w}}``; steps are global batches, counted across epochs;
    docs/curricula.md). With ``remote`` an object-storage URL (``s3://``, ``msc://``, ``gs://``), ``local`` is the
    cache it is read through, as in Mosaic: shards are downloaded into it on first use (``download_retry``
    re-attempts of ``download_timeout`` seconds each; ``.zstd`` / ``.gz`` shards decompressed there, the
    compressed copy kept with ``keep_zip``), ``validate_hash`` checked on each download (see docs/remote.md).
    Raises ValueError for more than one weight or a weight that is not a finite number > 0."""

    def __init__(self, *, remote=None, local=None, split=None, proportion=None, repeat=None, choose=None,
                 download_retry=None, download_timeout=None, validate_hash=None, keep_zip=None,
                 proportion_schedule=None):
        given = [n for n, v in (("proportion", proportion), ("repeat", repeat), ("choose", choose),
                                ("proportion_schedule", proportion_schedule)) if v is not None]
        if len(given) > 1:
            raise ValueError(f"Stream: at most one of proportion, repeat and choose (or proportion_schedule) may be "
                             f"given, got {given}")
        if proportion_schedule is not None:  # checked here, so the error names the stream's keyword
            from zephon.work.schedule import check_weight
            check_weight(proportion_schedule, "Stream: proportion_schedule")
        for n, v in (("proportion", proportion), ("repeat", repeat), ("choose", choose)):
            if v is None:
                continue
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v <= 0:
                raise ValueError(f"Stream: {n} must be a finite number > 0, got {v!r} (a stream that contributes "
                                 f"nothing should be left out)")
        if choose is not None and int(choose) != choose:
            raise ValueError(f"Stream: choose must be a whole number of samples, got {choose!r}")
        self.remote, self.local, self.split = remote, local, split
        self.proportion, self.repeat, self.choose = proportion, repeat, choose
        self.proportion_schedule = proportion_schedule
        self.download_retry, self.download_timeout = download_retry, download_timeout
        self.validate_hash, self.keep_zip = validate_hash, keep_zip

    def apply_default(self, default: dict) -> None:
        """Fill the attributes left None from ``default`` (the dataset's own keywords)."""
        for k, v in default.items():
            if getattr(self, k, None) is None:
                setattr(self, k, v)

    def __repr__(self):
        return (f"Stream(remote={self.remote!r}, local={self.local!r}, split={self.split!r}, "
                f"proportion={self.proportion!r}, repeat={self.repeat!r}, choose={self.choose!r})")

    def remote_url(self) -> str | None:
        """``remote`` when it is an object-storage URL Zephon reads, else None. Raises ``RefusedKeyword`` for a
        scheme it does not read (naming the ones it does)."""
        if self.remote is None:
            return None
        r = os.fspath(self.remote)
        if is_remote(r):
            return r
        if r.startswith(REMOTE_SCHEMES):
            refuse("remote", self.remote, f"this scheme is not read by Zephon (it reads {', '.join(SCHEMES)}:// "
                   f"URLs); copy the shards to a local or mounted directory and pass local=<dir>")
        return None

    def resolve(self) -> tuple[str, bool]:
        """``(directory or URL, is_mds)``: ``remote`` when it is an object-storage URL (read through ``local``),
        else ``local`` if it holds the shards, else ``remote`` when it is a local (or mounted) path. Raises
        ``RefusedKeyword`` for a URL scheme Zephon does not read, FileNotFoundError when no shards are found."""
        split = self.split or ""
        url = self.remote_url()
        if url is not None:
            base = url.rstrip("/") + (f"/{split}" if split else "")
            return url, is_mds_source(base + "/index.json", fetcher=detection_fetcher(
                {"download_retry": self.download_retry, "download_timeout": self.download_timeout}))
        tried = []
        for base in (self.local, self.remote):
            if base is None:
                continue
            b = os.fspath(base)
            if b.startswith("file://"):
                b = b[len("file://"):]
            p = os.path.join(b, split)
            tried.append(p)
            if os.path.isdir(p) and any(not n.startswith(".") for n in os.listdir(p)):
                return p, os.path.exists(os.path.join(p, "index.json"))
            if os.path.isfile(p):
                return p, False
        raise FileNotFoundError(f"{self!r}: no shards found (looked in {tried or 'nothing: give local= or remote='})")

    def open(self, *, allow_unsafe_types=False, predownload=None, cache_limit=None):
        """This stream as a ``zephon.formats`` Dataset (MDS or JSONL / Parquet files), reading a remote one through
        ``local`` with Mosaic's download keywords. Raises ``RefusedKeyword`` for ``validate_hash`` on files."""
        from zephon.formats import open_dataset

        path, is_mds = self.resolve()
        remote = {}
        if self.remote_url() is not None:
            remote = {"local": self.local, "download_retry": 2 if self.download_retry is None else self.download_retry,
                      "download_timeout": 60 if self.download_timeout is None else self.download_timeout,
                      "cache_limit": cache_limit}
        if is_mds:
            if remote:
                remote.update(split=self.split, keep_zip=bool(self.keep_zip), predownload=predownload)
            return open_dataset(path, format="mds", allow_unsafe_types=allow_unsafe_types,
                                validate_hash=self.validate_hash, **remote)
        if self.validate_hash:
            refuse("validate_hash", self.validate_hash, f"{path} holds JSONL/Parquet files, which carry no shard "
                   f"hashes; validate_hash applies to MDS shards only")
        if remote:
            if self.split:
                path = path.rstrip("/") + f"/{self.split}"
            if self.local is not None and self.split:
                remote["local"] = os.path.join(os.fspath(self.local), self.split)
        return open_dataset(path, **remote)
