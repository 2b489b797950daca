"""The loaders compared, each set up and resumed the way its users do it (one simulated rank = one instance).

Every peer gives ``open(D, state=None) -> ranks`` (one object per simulated rank whose ``next()`` is that
rank's rows of the next step: ``(inputs, targets)``, int64 ``[G / D, seq_len]``), ``save(ranks, step)``
(what a training checkpoint at ``step`` keeps of the loader) and ``resume(state, M, step) -> (ranks,
note)``; a resume a peer's rules do not allow raises ``Refused``. Here: Zephon, torch's
``DistributedSampler`` with per-rank packing, and TorchTitan's HF text loader (``split_dataset_by_node``);
``benchmarks.loss.hosts`` has Mosaic Streaming and Energon.
"""
from __future__ import annotations

import numpy as np
import torch


class Refused(Exception):
    """A resume the peer's own rules do not allow; the message says which rule."""


def stack(rows) -> tuple[torch.Tensor, torch.Tensor]:
    """``[(inputs, targets), ...]`` numpy rows -> int64 tensors ``[rows, seq]``."""
    return (torch.from_numpy(np.stack([r[0] for r in rows]).astype(np.int64)),
            torch.from_numpy(np.stack([r[1] for r in rows]).astype(np.int64)))


# ------------------------------------------------------------------------------ Zephon

class ZephonRank:
    """One rank's ``zephon.Loader``: a step is one row from each owned lane (``Batch(1)``), lanes ascending."""

    def __init__(self, loader, rows: int):
        self.loader, self.rows = loader, rows
        self.it = iter(loader)

    def __next__(self):
        rows = []
        for _ in range(self.rows):
            mb = next(self.it)
            ids, labels = mb["input_ids"][0], mb["labels"][0]
            rows.append((ids[:-1], labels[1:]))  # Pack rows are unshifted: the model predicts labels[t+1]
        return stack(rows)


class Zephon:
    """``zephon.Loader([train], [Decode, Tokenize, Pack(L+1), Shuffle, Batch(1)], canonical_replicas=R,
    global_batch_size=G, dp_degree=D, dp_rank=r)``; resume: ``merge_states`` of every rank's
    ``checkpoint()``, restored by each new rank.

    Args:
        m: data manifest (``data.prepare``).
        rows: global batch G (rows); replicas: ``canonical_replicas`` (a multiple of every dp degree).
        chunk_size, shuffle: WorkSource chunk size (pointers) and ``Shuffle`` buffer (rows).
    """

    name = "zephon"
    rule = "merge_states of the {n} rank checkpoints, restored by every new rank"

    def __init__(self, m: dict, rows: int, replicas: int, chunk_size: int = 32, shuffle: int = 8):
        from zephon import Batch, Decode, Pack, Shuffle, Tokenize, open_dataset

        self.rows, self.replicas, self.chunk_size = rows, replicas, chunk_size
        self.datasets = [open_dataset(m["train_files"], name="demo-train")]
        L = m["seq_len"] + 1  # one extra token: inputs and targets are the row shifted by one
        self.ops = [Decode("text"), Tokenize(m["tokenizer"], eos_id="<eos>", max_length=L), Pack(L),
                    Shuffle(shuffle, seed=0), Batch(1)]

    def open(self, D: int, state=None):
        from zephon import Loader

        out = []
        for r in range(D):
            L = Loader(self.datasets, self.ops, seed=0, canonical_replicas=self.replicas, chunk_size=self.chunk_size,
                       global_batch_size=self.rows, dp_degree=D, dp_rank=r, runner="inline")
            if state is not None:
                L.restore(state)
            out.append(ZephonRank(L, self.rows // D))  # nothing is read before the first next()
        return out

    def save(self, ranks, step: int):
        from zephon import merge_states

        return merge_states([rk.loader.checkpoint() for rk in ranks])

    def resume(self, state, M: int, step: int):
        return self.open(M, state), "restored"


# ------------------------------------------------------------------------------ per-rank packing (TorchTitan's loop)

class ConcatPacker:
    """Concatenate documents and cut rows of ``seq_len``, shifting inside each document (TorchTitan's
    ``HuggingFaceTextDataset`` loop): a per-rank token buffer carried from step to step.

    Args:
        docs: iterator of token-id arrays (EOS included).
        seq_len: tokens per row.
    """

    def __init__(self, docs, seq_len: int):
        self.docs, self.seq_len = docs, seq_len
        self.inp: list[int] = []
        self.tgt: list[int] = []

    def row(self):
        while len(self.inp) < self.seq_len:
            d = next(self.docs)
            self.inp.extend(d[:-1])
            self.tgt.extend(d[1:])
        r = (np.asarray(self.inp[:self.seq_len]), np.asarray(self.tgt[:self.seq_len]))
        del self.inp[:self.seq_len], self.tgt[:self.seq_len]
        return r


class SamplerRank:
    """A ``DataLoader(docs, sampler=DistributedSampler(D, r, shuffle=True, seed=0))`` feeding a per-rank
    ``ConcatPacker``; a new sampler epoch (``set_epoch``) when a pass ends."""

    def __init__(self, docs, D: int, r: int, rows: int, seq_len: int):
        from torch.utils.data import DataLoader, DistributedSampler

        self.sampler = DistributedSampler(docs, num_replicas=D, rank=r, shuffle=True, seed=0)
        self.dl = DataLoader(docs, sampler=self.sampler, batch_size=None, num_workers=0)
        self.rows = rows
        self.packer = ConcatPacker(self._docs(), seq_len)

    def _docs(self):
        epoch = 0
        while True:
            self.sampler.set_epoch(epoch)
            yield from self.dl
            epoch += 1

    def __next__(self):
        return stack([self.packer.row() for _ in range(self.rows)])


class TokenizedDocs(torch.utils.data.Dataset):
    """Map-style dataset of the training documents; ``__getitem__`` tokenizes (EOS appended)."""

    def __init__(self, m: dict):
        from tokenizers import Tokenizer

        from .data import _jsonl_texts

        self.texts = _jsonl_texts(m["train_files"])
        self.tok, self.eos = Tokenizer.from_file(m["tokenizer"]), m["eos"]

    def __len__(self):
        return len(self.texts)

    def __getitem__(self, i):
        return np.asarray(self.tok.encode(self.texts[i], add_special_tokens=False).ids + [self.eos])


class Sampler:
    """torch ``DataLoader`` + ``DistributedSampler`` + per-rank packing; resume on M ranks: new samplers for
    M ranks, each rank skips its first ``step`` batches (``accelerate.skip_first_batches``, Megatron's
    consumed-samples counter); the packer's buffer is not in the checkpoint."""

    name = "sampler"
    rule = "new DistributedSampler(M); each rank skips its first {k} batches (skip_first_batches)"

    def __init__(self, m: dict, rows: int):
        self.docs, self.rows, self.seq_len = TokenizedDocs(m), rows, m["seq_len"]

    def open(self, D: int, state=None):
        return [SamplerRank(self.docs, D, r, self.rows // D, self.seq_len) for r in range(D)]

    def save(self, ranks, step: int):
        return {"step": step}

    def resume(self, state, M: int, step: int):
        ranks = self.open(M)
        for rk in ranks:
            for _ in range(state["step"]):
                next(rk)
        return ranks, f"skipped {state['step']} batches per rank"


# ------------------------------------------------------------------------------ TorchTitan's HF text loader

class _TitanTokenizer:
    """What ``HuggingFaceTextDataset`` calls: ``encode(text, add_bos, add_eos)`` with the demo BPE."""

    def __init__(self, path: str):
        from tokenizers import Tokenizer

        self.tok = Tokenizer.from_file(path)
        self.bos, self.eos = self.tok.token_to_id("<bos>"), self.tok.token_to_id("<eos>")

    def encode(self, text: str, add_bos: bool = False, add_eos: bool = False) -> list[int]:
        return [self.bos] * add_bos + self.tok.encode(text, add_special_tokens=False).ids + [self.eos] * add_eos


class TitanRank:
    def __init__(self, dl):
        self.dl, self.it = dl, iter(dl)

    def __next__(self):
        inputs, labels = next(self.it)
        return inputs["input"].long(), labels.long()


class Titan:
    """TorchTitan's ``HuggingFaceTextDataLoader`` (``HuggingFaceTextDataset``: ``split_dataset_by_node``,
    per-rank packing) over ``datasets.load_dataset("json", streaming=True).shuffle(seed=0,
    buffer_size=1000)``. Its checkpoint refuses another dp degree (an assert in ``load_state_dict``);
    TorchTitan's way round is ``checkpoint.exclude_from_loading=["dataloader"]``: the loader starts over."""

    name = "titan"
    rule = "refused (dp_degree assert); exclude_from_loading=['dataloader']: the loader restarts"

    def __init__(self, m: dict, rows: int):
        from torchtitan.hf_datasets import DatasetConfig
        from torchtitan.hf_datasets import text_datasets

        self.m, self.rows = m, rows
        self.tok = _TitanTokenizer(m["tokenizer"])
        self._base = None
        # TorchTitan's documented way to add a dataset (hf_datasets/text_datasets.py: DATASETS).
        text_datasets.DATASETS["zephon_demo"] = DatasetConfig(path="zephon_demo", loader=self._load,
                                                             sample_processor=lambda s: s["text"])

    def _load(self, path):
        from datasets import load_dataset

        if self._base is None:  # one streaming dataset object; split_dataset_by_node makes each rank's view
            self._base = load_dataset("json", data_files=self.m["train_files"], split="train",
                                      streaming=True).shuffle(seed=0, buffer_size=1000)
        return self._base

    def open(self, D: int, state=None):
        from torchtitan.hf_datasets.text_datasets import HuggingFaceTextDataLoader

        cfg = HuggingFaceTextDataLoader.Config(dataset="zephon_demo", infinite=True)
        return [TitanRank(HuggingFaceTextDataLoader(cfg, dp_world_size=D, dp_rank=r, tokenizer=self.tok,
                                                    seq_len=self.m["seq_len"], local_batch_size=self.rows // D))
                for r in range(D)]

    def save(self, ranks, step: int):
        st = {}
        for rk in ranks:  # DCP would store each rank's entry under its own key
            st.update(rk.dl.state_dict())
        return st

    def resume(self, state, M: int, step: int):
        ranks = self.open(M)
        try:
            ranks[0].dl.load_state_dict(state)
        except AssertionError as e:
            return self.open(M), f"refused ({e}); data loader not loaded: restarts from its first batch"
        raise RuntimeError("TorchTitan accepted a checkpoint from another dp degree")
