"""One rank of Megatron-LM's own data path (megatron-core's ``megatron.training``) over zephon_energon.

Importable by ranks spawned with torch.multiprocessing (tests/test_megatron_contract.py). Each rank makes the
swap a Megatron-LM user makes (``sys.modules["megatron.energon"] = zephon_energon``), then calls Megatron's
functions, not copies: ``initialize_model_parallel``, ``parse_args`` + ``set_args`` (``--dataloader-type
external``), ``build_train_valid_test_data_iterators`` (which runs ``build_train_valid_test_datasets`` with the
provider, ``build_pretraining_data_loader`` and wraps the train loader in ``RerunDataIterator``),
``maybe_save_dataloader_state``, and on resume ``read_metadata(get_checkpoint_tracker_filename(load))`` for the
iteration, as ``load_checkpoint`` finds it. The provider is ``zephon_energon.megatron``'s (the shape of
Megatron-LM's ``examples/multimodal/dataloader_provider.py``), which reads the states through
``get_checkpoint_name``.

Patched, because they need CUDA and nothing else here does: the tensors that ``build_train_valid_test_data_loaders``
(its do-train/valid/test flags) and ``read_metadata`` (the iteration, all-reduced over ranks) create with
``device="cuda"`` for a collective: made on the CPU instead, for gloo (``cpu_flags``). No model is
built, so ``pretrain()``'s model and ``save_checkpoint``'s model part are not run; the tracker file
``latest_checkpointed_iteration.txt`` that ``save_checkpoint`` writes after the model is written by rank 0 here.
"""
from __future__ import annotations

import contextlib
import datetime
import json
import os
import sys

import torch
import torch.distributed as dist


class _CpuTensors:
    """``torch`` as ``megatron.training.training`` sees it, except that ``torch.tensor(..., device="cuda")``
    makes a CPU tensor (gloo broadcasts CPU tensors)."""

    def __getattr__(self, name):
        return getattr(torch, name)

    @staticmethod
    def tensor(*a, **kw):
        if kw.get("device") == "cuda":
            kw["device"] = "cpu"
        return torch.tensor(*a, **kw)


@contextlib.contextmanager
def cpu_flags(module):
    """Within the block, ``module.torch`` makes CPU tensors where it asks for CUDA ones (see _CpuTensors)."""
    saved = module.torch
    module.torch = _CpuTensors()
    try:
        yield
    finally:
        module.torch = saved


def _extra_args(parser):
    """What a user adds with ``pretrain(..., extra_args_provider=...)``: ``--dataloader-save`` (as
    Megatron-LM's examples/multimodal/multimodal_args.py adds it) and Zephon's lane count."""
    group = parser.add_argument_group(title="energon data loader")
    group.add_argument("--dataloader-save", type=str, default=None, help="Energon dataloader state save path")
    group.add_argument("--canonical-replicas", type=int, default=None)
    return parser


def megatron_args(spec: dict, world: int):
    """Megatron-LM's argument namespace from its own ``parse_args`` + ``validate_args``, as ``pretrain`` builds it.

    spec: path, ckpt (the --dataloader-save / --load directory), num_workers, canonical_replicas, load (bool).
    world: data-parallel size (one rank per process, tp = pp = 1)."""
    from megatron.training.arguments import parse_args, validate_args

    argv = ["pretrain_gpt.py", "--micro-batch-size", "2", "--global-batch-size", str(2 * world),
            "--dataloader-type", "external", "--num-workers", str(spec["num_workers"]),
            "--data-path", spec["path"], "--train-iters", "1000", "--eval-iters", "0", "--eval-interval", "1000",
            "--dataloader-save", spec["ckpt"], "--save", spec["ckpt"], "--save-interval", "1000",
            "--canonical-replicas", str(spec["canonical_replicas"]),
            # a model is never built; validate_args wants its shape
            "--num-layers", "1", "--hidden-size", "8", "--num-attention-heads", "1", "--seq-length", "8",
            "--max-position-embeddings", "8", "--tokenizer-type", "NullTokenizer", "--vocab-size", "64"]
    if spec.get("load"):
        argv += ["--load", spec["ckpt"]]
    saved, sys.argv = sys.argv, argv
    try:
        args = validate_args(parse_args(extra_args_provider=_extra_args), {})
    finally:
        sys.argv = saved
    args.iteration = 0  # what pretrain() sets before load_checkpoint
    return args


def rank_job(rank, world, init_file, spec):
    """One data-parallel rank: build Megatron's train iterator, run ``spec["iters"]`` iterations (from the
    resumed iteration, or 0), save the
    loader state with ``maybe_save_dataloader_state`` at ``spec["save_at"]`` (if set).

    spec: megatron_args' keys plus save_at (iteration or None), load (resume from the tracker's iteration),
    out (rank 0 writes ``{"iteration": start, "batches": [rank][i] = keys of micro-batch i, "provider_print":
    ...}`` there). Megatron's printing goes to stdout as usual."""
    import zephon_energon

    sys.modules["megatron.energon"] = zephon_energon  # the swap (docs/energon.md)
    # What torchrun sets and Megatron's parse_args reads.
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank))
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=120))
    from megatron.core import parallel_state
    from megatron.training import checkpointing, training
    from megatron.training.global_vars import set_args

    from zephon_energon.megatron import train_valid_test_dataloaders_provider as provider

    parallel_state.initialize_model_parallel()  # tp = pp = 1: data-parallel size = world
    args = megatron_args(spec, world)
    if spec.get("load"):  # the iteration load_checkpoint resumes from
        with cpu_flags(checkpointing):  # read_metadata agrees on the iteration over ranks with a CUDA tensor
            args.iteration, _release = checkpointing.read_metadata(
                checkpointing.get_checkpoint_tracker_filename(args.load))
    set_args(args)
    provider.is_distributed = True  # as examples/multimodal/train.py marks its provider
    with cpu_flags(training):
        train_it, _valid, _test = training.build_train_valid_test_data_iterators(provider)
    batches = []
    for it in range(args.iteration, args.iteration + spec["iters"]):
        batches.append(list(next(train_it).__key__))
        if spec.get("save_at") == it + 1:
            checkpointing.maybe_save_dataloader_state(train_it, it + 1, args.dataloader_save)
            dist.barrier()
            if rank == 0:  # save_checkpoint's tracker, written after the (here absent) model
                with open(checkpointing.get_checkpoint_tracker_filename(args.save), "w") as fh:
                    fh.write(str(it + 1))
    gathered = [None] * world if rank == 0 else None
    dist.gather_object({"batches": batches, "type": type(train_it).__name__}, gathered, dst=0)
    if rank == 0:
        with open(spec["out"], "w") as fh:
            json.dump({"iteration": args.iteration, "batches": [g["batches"] for g in gathered],
                       "iterator": gathered[0]["type"]}, fh)
    dist.barrier()
    os._exit(0)  # see torch_jobs._leave: gloo may hang while the interpreter finalises
