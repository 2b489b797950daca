"""A TorchTitan data loader backed by Zephon.

Follows torchtitan 0.3's ``BaseDataLoader`` contract (``torchtitan.components.dataloader``) and the
constructor shape of its ``HuggingFaceTextDataLoader``: ``(config, *, dp_world_size, dp_rank, tokenizer,
seq_len, local_batch_size)``, yielding ``({"input": [B, seq_len], "positions": [B, seq_len]},
labels [B, seq_len])`` with labels already shifted and ``-100`` where a document's last token would
predict the next document (as torchtitan's own text dataset shifts within documents).

TorchTitan's own loader stores one pickled state per dp rank (``{"dp_rank_{r}": ..., "world_size": n}``)
and refuses a changed dp degree. Here ``state_dict()`` has the same shape, but each ``dp_rank_{r}`` is a
uint8 tensor of this rank's Zephon rank entry as JSON (its lanes only, no collective, no pickle) and
``world_size`` an int64 tensor. A restore at another dp degree reads only the entries holding the lanes the
rank now owns: ``prepare_load(checkpoint_id)`` reads DCP's metadata and shapes the next ``state_dict()`` as
the template DCP loads into (``ZephonCheckpointManager`` in ``titan_config`` calls it inside TorchTitan's
load). A checkpoint of 0.2.0 (one merged ``zephon_state`` tensor) still restores. docs/distributed.md.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field

import torch

from zephon import Schedule
from zephon.host import CheckpointError, decode_state, load_rank_states, rank_entries_needed, save_rank_state
from zephon.formats import open_dataset
from zephon.ops import Batch, Decode, Pack, Shuffle, Tokenize

from .dataset import ZephonIterableDataset
from .loader import StatefulDataLoader

try:  # torchtitan is optional: without it the class follows the same protocol on its own.
    from torchtitan.components.dataloader import BaseDataLoader as _Base
    HAVE_TORCHTITAN = True
except ImportError:  # pragma: no cover - exercised only where torchtitan is absent
    HAVE_TORCHTITAN = False

    class _Base:  # the protocol: __iter__, state_dict, load_state_dict, nested Config
        @dataclass(kw_only=True, slots=True)
        class Config:
            dataset: str = ""
            dataset_path: str | None = None

#: Key of 0.2.0's merged checkpoint (a uint8 tensor of JSON, zero-padded): still restored, no longer written.
STATE_KEY = "zephon_state"
#: TorchTitan's per-rank key (``ParallelAwareDataloader``) and its saved dp degree's key.
RANK_KEY, WORLD_KEY = "dp_rank_{}", "world_size"


class ZephonTextDataLoader(_Base):
    """TorchTitan text data loader: tokenize + pack + shuffle + mix on the fly, elastic across dp degrees.

    ``Config`` fields (TorchTitan's ``dataset_path`` plus Zephon's): ``dataset_path`` one or more inputs
    separated by ``,`` (JSONL/Parquet/MDS files, directories or globs), ``weights`` (same count, default
    equal), ``schedule`` (a YAML/JSON mixture schedule file, weights that change with the step; replaces
    ``weights``: docs/curricula.md), ``text_field`` ("text"), ``canonical_replicas`` (lanes, fixed for the run:
    every dp degree used must divide it or be a multiple of it, ranks then sharing lanes: docs/distributed.md),
    ``seed``, ``shuffle_buffer`` (rows, 0 = off), ``chunk_size``, ``num_workers`` (DataLoader workers; may change
    between runs), ``prefetch_factor``, ``pin_memory``, ``persistent_workers`` (False only), ``infinite``,
    ``packing`` (``"best_fit"``, the default: documents in padded rows of ``seq_len + 1`` tokens; ``"first_fit"``;
    ``"concat"``: documents end to end cut into windows of ``seq_len + 1`` tokens sharing one, as Megatron-LM and
    TorchTitan's own text dataset build them, no padding).
    Keyword arguments as torchtitan passes them: ``dp_world_size``, ``dp_rank``, ``tokenizer`` (a
    torchtitan ``HuggingFaceTokenizer``, a ``tokenizers.Tokenizer`` or a tokenizer.json path),
    ``seq_len`` (tokens per row), ``local_batch_size`` (rows per rank per step; ``local_batch_size *
    dp_world_size`` is the global batch and must be a multiple of ``canonical_replicas``),
    ``snapshot_every_n_steps`` (accepted as in ``HuggingFaceTextDataLoader``; no effect, the state is exact
    at every step).
    TorchTitan job configs that select this loader: ``zephon_torch.titan_config``.
    Raises ``TopologyError`` for a dp degree that neither divides ``canonical_replicas`` nor is a multiple of it,
    ``ValueError``
    for inconsistent sizes, ``CheckpointError`` from ``load_state_dict`` for another config."""

    @dataclass(kw_only=True, slots=True)
    class Config(_Base.Config):
        weights: list[float] = field(default_factory=list)
        schedule: str | None = None
        text_field: str = "text"
        canonical_replicas: int = 8
        seed: int = 0
        shuffle_buffer: int = 64
        chunk_size: int = 256
        num_workers: int = 0
        prefetch_factor: int | None = None
        pin_memory: bool = False
        persistent_workers: bool = False  # TorchTitan's field; True is refused (see __init__)
        infinite: bool = True
        packing: str = "best_fit"

    def __init__(self, config: Config, *, dp_world_size: int, dp_rank: int, tokenizer, seq_len: int,
                 local_batch_size: int, snapshot_every_n_steps: int | None = 1, **kwargs):
        # snapshot_every_n_steps (torchtitan's HuggingFaceTextDataLoader keyword) has no effect: the state
        # is exact at every step, read from the rows consumed, never from a worker snapshot.
        if config.persistent_workers:
            raise ValueError("ZephonTextDataLoader.Config.persistent_workers=True is not supported: workers kept "
                             "across iterations would carry rows prefetched but never consumed into the next one")
        if kwargs:
            raise ValueError(f"unsupported keyword arguments {sorted(kwargs)}: set them on "
                             f"ZephonTextDataLoader.Config")
        if not config.dataset_path:
            raise ValueError("ZephonTextDataLoader.Config.dataset_path is empty: give JSONL/Parquet/MDS inputs")
        self.config, self.dp_world_size, self.dp_rank = config, dp_world_size, dp_rank
        self.seq_len, self.local_batch_size = seq_len, local_batch_size
        paths = [p.strip() for p in str(config.dataset_path).split(",") if p.strip()]
        datasets = [open_dataset(p) for p in paths]
        tok, bos, eos = _tokenizer(tokenizer)
        # One more token than seq_len, then shift: input = ids[:-1], labels = next token (concat: Pack shifts,
        # windows of seq_len + 1 tokens overlapping by one, and cuts documents of any length itself).
        concat = config.packing == "concat"
        ops = [Decode(config.text_field),
               Tokenize(tok, bos_id=bos, eos_id=eos, add_bos=bos is not None, add_eos=eos is not None,
                        max_length=None if concat else seq_len + 1),
               Pack(seq_len, method="concat", shift_labels=True) if concat
               else Pack(seq_len + 1, method=config.packing)]
        self._shifted = concat
        if config.shuffle_buffer:
            ops.append(Shuffle(config.shuffle_buffer, seed=config.seed))
        global_batch = local_batch_size * dp_world_size
        if global_batch % config.canonical_replicas:
            raise ValueError(f"global batch {global_batch} (local_batch_size {local_batch_size} x dp {dp_world_size}) "
                             f"is not a multiple of canonical_replicas={config.canonical_replicas}")
        # One local micro-batch = the local batch: a lane's step, or (more ranks than lanes, sharing each lane)
        # this rank's block of it. The micro-batch size is not in the checkpoint's config: dp may cross R.
        ops.append(Batch(global_batch // max(config.canonical_replicas, dp_world_size)))
        self.dataset = ZephonIterableDataset(
            datasets, ops, dp_degree=dp_world_size, dp_rank=dp_rank, weights=_weights(config, len(datasets)),
            seed=config.seed, canonical_replicas=config.canonical_replicas, chunk_size=config.chunk_size,
            global_batch_size=global_batch, exhaustion="repeat" if config.infinite else "stop")
        dl_kwargs = {"num_workers": config.num_workers, "pin_memory": config.pin_memory}
        if config.num_workers:
            dl_kwargs["prefetch_factor"] = config.prefetch_factor or 2
        self.dataloader = StatefulDataLoader(self.dataset, **dl_kwargs)
        self._template = None  # prepare_load's: what the next state_dict() returns, once

    def __iter__(self):
        for b in self.dataloader:
            if self._shifted:  # Pack(shift_labels=True): labels are the next tokens already
                yield {"input": b["input_ids"], "positions": b["position_ids"]}, b["labels"]
                continue
            yield ({"input": b["input_ids"][:, :-1], "positions": b["position_ids"][:, :-1]},
                   b["labels"][:, 1:])

    # -- Stateful (DCP) --------------------------------------------------------------------------
    def state_dict(self) -> dict:
        """``{"dp_rank_{r}": uint8 tensor [bytes], "world_size": int64 tensor []}``: this rank's entry
        (``save_rank_state``) as JSON, no collective. After ``prepare_load`` (once): the template DCP loads
        the needed entries into."""
        if self._template is not None:
            template, self._template = self._template, None
            return template
        entry = save_rank_state(self.dataloader.rank_state_dict(), self.dp_world_size, self.dp_rank)
        raw = json.dumps(entry, sort_keys=True, separators=(",", ":")).encode()
        return {RANK_KEY.format(self.dp_rank): torch.frombuffer(bytearray(raw), dtype=torch.uint8),
                WORLD_KEY: torch.tensor(self.dp_world_size, dtype=torch.int64)}

    def prepare_load(self, checkpoint_id, key: str = "dataloader") -> list[str]:
        """Read DCP's metadata of ``checkpoint_id`` and make the next ``state_dict()`` the template of only
        the entries this rank needs (``rank_entries_needed``: at most ceil(saved dp / dp) + 1 of them), so
        that ``dcp.load({key: loader, ...}, checkpoint_id=...)`` reads those and nothing else.

        checkpoint_id: the DCP checkpoint directory. key: the loader's key in the saved state dict.
        Returns the keys to be read (without ``key.``). Raises ``CheckpointError`` when the checkpoint holds
        no Zephon loader state under ``key``."""
        from torch.distributed.checkpoint import FileSystemReader

        meta = FileSystemReader(str(checkpoint_id)).read_metadata().state_dict_metadata
        prefix = key + "."
        sizes = {k[len(prefix):]: m.size for k, m in meta.items() if k.startswith(prefix) and hasattr(m, "size")}
        if STATE_KEY in sizes:  # 0.2.0: one merged checkpoint, replicated
            self._template = {STATE_KEY: torch.zeros(sizes[STATE_KEY], dtype=torch.uint8)}
            return [STATE_KEY]
        saved_dp = sum(1 for k in sizes if k.startswith("dp_rank_"))
        if not saved_dp or WORLD_KEY not in sizes:
            found = sorted(k for k in meta if k.startswith(prefix))  # e.g. TorchTitan's own pickled entries
            raise CheckpointError(f"{checkpoint_id}: no Zephon data loader state under {key!r} (keys there: "
                                  f"{found[:8]}; Zephon writes uint8 tensors {key}.dp_rank_{{r}} and "
                                  f"{key}.world_size)")
        needed = [RANK_KEY.format(r) for r in rank_entries_needed(
            saved_dp, self.dp_world_size, self.dp_rank, self.config.canonical_replicas)]
        missing = [k for k in needed if k not in sizes]
        if missing:
            raise CheckpointError(f"{checkpoint_id}: {key}.{missing[0]} is missing ({saved_dp} rank entries saved)")
        self._template = {k: torch.zeros(sizes[k], dtype=torch.uint8) for k in needed}
        self._template[WORLD_KEY] = torch.zeros((), dtype=torch.int64)
        return sorted(self._template)

    def load_state_dict(self, state_dict: dict) -> None:
        """Restore from the entries DCP loaded into ``prepare_load``'s template (saved at any dp degree
        that divides ``canonical_replicas`` or is a multiple of it), from 0.2.0's merged ``zephon_state``,
        or from a same-dp ``state_dict()``. An empty dict is a fresh start, as in torchtitan. Raises
        ``CheckpointError`` (another config, missing lanes or entries, malformed) instead of silently
        starting over."""
        self._template = None
        if not state_dict:
            return
        if STATE_KEY in state_dict:
            self.dataloader.load_state_dict(_json(state_dict[STATE_KEY]))
            return
        if WORLD_KEY not in state_dict:
            raise CheckpointError(f"data loader state has neither {WORLD_KEY!r} nor {STATE_KEY!r} (keys "
                                  f"{sorted(state_dict)}): not saved by ZephonTextDataLoader")
        saved_dp = int(state_dict[WORLD_KEY])

        def read_entry(old_rank: int) -> dict:
            k = RANK_KEY.format(old_rank)
            if k not in state_dict:
                raise CheckpointError(f"data loader state lacks {k!r} (saved at dp {saved_dp}; loaded keys "
                                      f"{sorted(state_dict)}): call prepare_load(checkpoint_id) before dcp.load "
                                      f"when the dp degree changed (ZephonCheckpointManager does)")
            return _json(state_dict[k])
        self.dataloader.load_state_dict(load_rank_states(read_entry, saved_dp, self.dp_world_size, self.dp_rank,
                                                         self.config.canonical_replicas))


def _json(tensor) -> dict:
    """The JSON object a uint8 tensor holds (trailing zero bytes ignored)."""
    return decode_state(tensor.to(torch.uint8).cpu().numpy().tobytes())


def _weights(config, num_datasets: int):
    """The mixture: ``Config.schedule`` loaded (a ``Schedule``), else ``Config.weights`` or None (equal).
    Raises ``ValueError`` when both are set or the schedule's dataset count differs from the inputs'."""
    if not config.schedule:
        return config.weights or None
    if config.weights:
        raise ValueError("ZephonTextDataLoader.Config: set schedule or weights, not both (a schedule replaces "
                         "the weights)")
    schedule = Schedule.load(config.schedule)
    if schedule.num_datasets != num_datasets:
        raise ValueError(f"{config.schedule}: a schedule of {schedule.num_datasets} datasets for {num_datasets} "
                         f"inputs in dataset_path")
    return schedule


def _tokenizer(tokenizer):
    """``(tokenizers.Tokenizer or path, bos_id, eos_id)`` from a torchtitan tokenizer or our inputs."""
    inner = getattr(tokenizer, "tokenizer", None)
    if inner is not None and hasattr(inner, "encode_batch"):
        return inner, getattr(tokenizer, "bos_id", None), getattr(tokenizer, "eos_id", None)
    from zephon.ops.tokenize import load_tokenizer

    tok = load_tokenizer(tokenizer) if isinstance(tokenizer, str) else tokenizer
    eos = next((t for t in ("<|endoftext|>", "</s>", "<eos>") if tok.token_to_id(t) is not None), None)
    return tok, None, tok.token_to_id(eos) if eos else None
