"""TorchTitan job configs that select Zephon's data loader, through TorchTitan's own config system.

torchtitan 0.3 picks a job with ``--module <python module> --config <function>``: the function returns a
``Trainer.Config``, and any field can then be overridden on the command line (``--dataloader.dataset_path
...``). This module is such a ``--module``; its functions are TorchTitan's own llama3 configs with
``dataloader=ZephonTextDataLoader.Config(...)``. Nothing of TorchTitan is forked or patched::

    torchrun --nproc_per_node 4 -m torchtitan.train --module zephon_torch.titan_config \\
        --config zephon_llama3_debugmodel --hf_assets_path ./tokenizer_dir \\
        --dataloader.dataset_path data/web,data/code.parquet --dataloader.weights 0.7,0.3 \\
        --dataloader.canonical_replicas 64

docs/distributed.md#torchtitan lists the fields and the resume behaviour.
"""
from __future__ import annotations

from dataclasses import dataclass, fields

from torchtitan.components.checkpoint import DATALOADER, CheckpointManager
from torchtitan.models.common.config_utils import decoder_vocab_size
from torchtitan.models.llama3 import model_registry
from torchtitan.models.llama3.config_registry import llama3_debugmodel
from torchtitan.trainer import Trainer

from .titan import ZephonTextDataLoader


class ZephonCheckpointManager(CheckpointManager):
    """TorchTitan's DCP ``CheckpointManager``, unchanged but for one step of its load: before DCP reads the
    checkpoint, the Zephon loader reads its metadata (``ZephonTextDataLoader.prepare_load``) so that each rank
    reads only the ``dataloader.dp_rank_{r}`` entries holding the lanes it owns, at any dp degree. Loads
    that exclude the data loader (``checkpoint.exclude_from_loading=["dataloader"]``, model-only) skip it."""

    @dataclass(kw_only=True, slots=True)
    class Config(CheckpointManager.Config):
        pass

    def dcp_load(self, state_dict, checkpoint_id, from_hf, from_quantized):
        loader = state_dict.get(DATALOADER)
        if not from_hf and hasattr(loader, "prepare_load"):
            loader.prepare_load(checkpoint_id, key=DATALOADER)
        return super().dcp_load(state_dict, checkpoint_id, from_hf, from_quantized)


def _with_zephon(config: Trainer.Config) -> Trainer.Config:
    """``config`` with Zephon's loader, ``ZephonCheckpointManager`` (same fields as TorchTitan's) and
    without TorchTitan's validator (it reads TorchTitan's own C4 validation set, which a Zephon job does not
    have; configure one with ``--validator.*`` if wanted)."""
    config.dataloader = ZephonTextDataLoader.Config(canonical_replicas=64)
    config.checkpoint = ZephonCheckpointManager.Config(
        **{f.name: getattr(config.checkpoint, f.name) for f in fields(CheckpointManager.Config)})
    config.validator.enable = False
    return config


def zephon_llama3_debugmodel() -> Trainer.Config:
    """TorchTitan's ``llama3_debugmodel`` (6 layers, dim 256, vocab 2048) reading through Zephon."""
    return _with_zephon(llama3_debugmodel())


def zephon_llama3_1b() -> Trainer.Config:
    """TorchTitan's llama3 1B flavour (the launch experiment's size; Llama 3's 128k vocabulary, so
    ``--hf_assets_path`` holds a Llama 3 tokenizer) reading through Zephon; the rest as the debug job."""
    config = zephon_llama3_debugmodel()
    config.model_spec = model_registry("1B")
    config.loss.loss_fn.global_vocab_size = decoder_vocab_size(config.model_spec)
    return config
