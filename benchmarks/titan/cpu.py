"""The smallest patch that lets torchtitan 0.3.0's own Trainer train on CPU (gloo), applied in-process.

Nothing in site-packages is edited; ``patch_for_cpu()`` runs in each rank before the Trainer is built.
Two things stop TorchTitan on a machine without an accelerator, and configuration reaches neither:

1. Device selection. ``torchtitan.tools.utils`` falls back to ``device_type = "cuda"`` when no accelerator
   is present, and five modules bind ``device_type`` / ``device_module`` at import. The patch points
   them to ``"cpu"`` and to a stand-in for ``torch.cuda``'s device API (``set_device``, memory statistics,
   ``synchronize``) that ``torch.cpu`` lacks; the memory monitor then reports 0 GiB.
2. Attention. Llama 3 only takes FlexAttention (or varlen, CUDA only), and torch's FlexAttention raises
   "does not support backward on CPU". The patch computes the same block-causal attention with
   ``scaled_dot_product_attention`` and the boolean mask materialised from the BlockMask's own
   ``mask_mod`` (same positions, same masking; dense, so only for small ``seq_len``). TorchTitan's
   ``--debug.deterministic`` recompiles FlexAttention over this patch: leave it off on CPU.

What configuration does reach is set on the command line instead (benchmarks/titan/train.py):
DDP (``parallelism.data_parallel_replicate_degree = world``, ``data_parallel_shard_degree = 1``),
because FSDP's reduce-scatter uses ``ReduceOp.PREMUL_SUM``, which gloo refuses.
"""
from __future__ import annotations

import importlib
import os
import types

#: Modules that bind ``device_type`` (and some ``device_module``) from torchtitan.tools.utils at import.
_DEVICE_MODULES = ("torchtitan.tools.utils", "torchtitan.components.metrics", "torchtitan.distributed.parallel_dims",
                   "torchtitan.distributed.utils", "torchtitan.models.common.token_dispatcher")


def _cpu_device_module():
    """What TorchTitan calls on ``torch.cuda``, answered for the CPU."""
    memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    return types.SimpleNamespace(
        set_device=lambda device: None, current_device=lambda: 0, device_count=lambda: 1,
        get_device_name=lambda device=None: "cpu",
        get_device_properties=lambda device=None: types.SimpleNamespace(total_memory=memory, name="cpu"),
        reset_peak_memory_stats=lambda device=None: None, empty_cache=lambda: None,
        memory_stats=lambda device=None: {}, synchronize=lambda device=None: None)


def _dense_flex_attention(q, k, v, *, score_mod, block_mask, scale, enable_gqa, return_aux, kernel_options):
    """FlexAttention's result for ``score_mod=None`` by SDPA under the BlockMask's mask (q, k, v: [B, N, L, H]).
    Raises ``NotImplementedError`` for a score_mod or an auxiliary output (Llama 3 asks for neither)."""
    import torch
    from torch.nn.attention.flex_attention import AuxOutput, create_mask

    if score_mod is not None or return_aux.lse:
        raise NotImplementedError("the CPU attention patch covers score_mod=None without lse only")
    mask = create_mask(block_mask.mask_mod, q.shape[0], 1, q.shape[2], k.shape[2], q.device)
    out = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale,
                                                           enable_gqa=enable_gqa)
    return out, AuxOutput()


def patch_for_cpu() -> None:
    """Point TorchTitan at the CPU and give FlexAttention a CPU backward (see the module docstring)."""
    cpu = _cpu_device_module()
    for name in _DEVICE_MODULES:
        module = importlib.import_module(name)
        module.device_type = "cpu"
        if hasattr(module, "device_module"):
            module.device_module = cpu
    from torchtitan.models.common.attention import FlexAttention

    FlexAttention._compiled_flex_attn = _dense_flex_attention
