"""The host-contract items: the rows of MATRIX.md.

Each row is one promise an adapter makes to its host framework. A test proves a row by carrying
``@pytest.mark.contract("<row id>")`` (several rows allowed); ``tests/test_contract_map.py`` checks that
every row has at least one test and that no test names an unknown row. The harness
(``python -m compat_matrix run``) runs the tagged tests in every environment of ``manifest.toml``.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Contract:
    id: str      # "<host>.<item>", the marker argument
    host: str    # host group: a key of HOSTS
    title: str   # one line for the matrix


HOSTS = {
    "streaming": "Mosaic Streaming (zephon_streaming, mosaicml-streaming 0.13 API)",
    "composer": "Mosaic Composer Trainer (zephon_streaming inside composer.Trainer)",
    "energon": "Megatron-Energon (zephon_energon, megatron.energon API)",
    "torch": "PyTorch DataLoader / torchdata StatefulDataLoader / torch.distributed (zephon_torch)",
    "torchtitan": "TorchTitan (zephon_torch.titan)",
    "megatron": "Megatron-LM's own training code (megatron.training) driving zephon_energon",
    "llmfoundry": "llm-foundry (llmfoundry.data.text_data on zephon_streaming, inside composer.Trainer)",
}

_ROWS = [
    # Mosaic Streaming
    ("streaming.keywords",
     "StreamingDataset/Stream accept 0.13's keyword names; unsupported ones are refused with the reason"),
    ("streaming.mds_format",
     "MDS shards written by streaming.MDSWriter read equal to streaming.StreamingDataset "
     "(encodings, compression, hashes)"),
    ("streaming.state_dict",
     "state_dict(num_samples, from_beginning) / load_state_dict: JSON state, other config refused"),
    ("streaming.epochs",
     "each __iter__ is the next epoch; per-rank __len__ equals what is yielded, equal on every rank"),
    ("streaming.resume", "mid-epoch and epoch-end resume continue exactly"),
    ("streaming.elastic", "resume at another world size / num_workers gives identical global batches"),
    ("streaming.dataloader", "StreamingDataLoader and torch DataLoader workers give the rank's exact stream and state"),
    ("streaming.mixture", "Stream proportion / repeat / choose and replication behave like Mosaic's"),
    ("streaming.batching", "batching_method stratified / per_stream / device_per_stream compose batches as "
     "mosaicml-streaming's own StreamingDataset does"),
    # Composer
    ("composer.trainer", "a real composer.Trainer (CPU) trains on zephon_streaming.StreamingDataset"),
    ("composer.resume", "Trainer checkpoint mid-epoch + load_path resume: batches identical to an uninterrupted run"),
    ("composer.elastic", "composer launcher, gloo: checkpoint on 2 ranks, resume on 1, identical global batches"),
    ("composer.metrics", "zephon_streaming.ZephonMetrics in a real composer.Trainer: Composer's logger receives "
     "Loader.metrics() every n batches, equal to counts of the batches trained on"),
    # Energon
    ("energon.format", "Energon-prepared WebDataset read: samples equal megatron.energon's per key"),
    ("energon.metadataset", "metadataset v2 blend / blend_epochized / subset equal Energon's"),
    ("energon.keywords", "get_train_dataset / get_loader / get_savable_loader keywords; refused ones say why"),
    ("energon.savable_loader", "save_state_rank / restore_state_rank / save_state_global / restore_state_global"),
    ("energon.task_encoder", "user TaskEncoder hooks: encode_sample, packing, batch/encode_batch, @stateless"),
    ("energon.elastic", "restore at another world size / num_workers gives identical global batches"),
    ("energon.val", "get_val_dataset(s): one ordered pass split over ranks, limit like Energon"),
    ("energon.megatron", "Megatron-LM dataset provider resumes at another world size"),
    # Megatron-LM (megatron-core's megatron.training, with megatron.energon swapped for zephon_energon)
    ("megatron.loaders",
     "build_train_valid_test_datasets + build_pretraining_data_loader (dataloader_type external) iterate "
     "zephon_energon's loaders through RerunDataIterator on real gloo ranks, keys equal to an uninterrupted run"),
    ("megatron.dataloader_state",
     "maybe_save_dataloader_state writes train_dataloader_dprank{dp:03d}.pt under get_checkpoint_name; "
     "Megatron's load path resumes at dp 1/2/4/8 with every micro-batch equal to an uninterrupted run"),
    # torch
    ("torch.dataloader", "torch DataLoader workers (num_workers 0..3) reproduce the rank's global batches"),
    ("torch.stateful", "StatefulDataLoader state_dict/load_state_dict: JSON, resumes at other num_workers and dp"),
    ("torch.finite", "finite streams: every rank stops at the single-rank last step"),
    ("torch.distributed", "real torch.distributed (gloo) ranks: merged checkpoint, elastic resume"),
    ("torch.faults", "a dead, hung or absent rank is named within the timeout; partial merges refused"),
    # torchtitan
    ("torchtitan.loader",
     "BaseDataLoader subclass: constructor shape, (input, positions)/labels batches, DCP-able state"),
    ("torchtitan.dcp_resume",
     "training loop with DCP save/load of model + optimizer + loader: resumed at dp 1/2/4, identical global "
     "batches; at the same dp, identical losses"),
    ("torchtitan.trainer.config",
     "a TorchTitan job config (--module zephon_torch.titan_config) selects Zephon through TorchTitan's "
     "ConfigManager; config.dataloader.build(...) with the Trainer's keywords"),
    ("torchtitan.trainer.elastic",
     "TorchTitan's own Trainer (CPU, gloo, llama3 debugmodel): CheckpointManager saves, resume at another dp "
     "through its load path, identical global batches; its ParallelAwareDataloader refuses the dp change"),
    ("torchtitan.trainer.launch",
     "the launch experiment's script (checkpoint at step 150 on 16 ranks, resume on 8/32/64; CPU ranks "
     "simulate missing GPUs) plans it and dry-runs on CPU"),
    # llm-foundry
    ("llmfoundry.text_dataloader",
     "build_text_dataloader / StreamingTextDataset on zephon_streaming (streaming's two names swapped first): "
     "the subclass's __getitem__ (tokenize, truncate) is honoured, local tokenizer, no Hub"),
    ("llmfoundry.trainer_resume",
     "composer.Trainer, 2 epochs, checkpoint mid-epoch on 2 gloo ranks, resume on 1: every batch equals the "
     "uninterrupted run's by sample id"),
]

CONTRACTS = [Contract(i, i.split(".", 1)[0], t) for i, t in _ROWS]
BY_ID = {c.id: c for c in CONTRACTS}
assert all(c.host in HOSTS for c in CONTRACTS)
