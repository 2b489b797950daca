"""Mosaic Streaming and Energon as peers of the loss-curve experiment (see ``benchmarks.loss.baselines``
for the peer interface).

Mosaic: its users pretrain on MDS rows tokenized and concatenated offline (LLM Foundry's
``--concat_tokens``); a rank's rows are what its ``StreamingDataset`` would read: the sample ids come from
Mosaic's own ``generate_work`` for the simulated world (8 ranks per node, ``num_canonical_nodes=8``), read
with ``get_item``. Energon: ``get_train_dataset`` + ``get_savable_loader`` per rank (``num_workers=0``) with
a TaskEncoder that tokenizes and packs (Energon's ``select_samples_to_pack`` / ``pack_selected_samples``).
"""
from __future__ import annotations

import glob
import os
import subprocess
import sys
import tempfile

import numpy as np
import torch

from .baselines import Refused, stack

RANKS_PER_NODE = 8


def _world(D: int):
    """Mosaic's ``World`` of rank 0 of a D-rank job, 8 ranks per node, no DataLoader workers."""
    from streaming.base.world import World

    rpn = min(D, RANKS_PER_NODE)
    return World(num_nodes=D // rpn, ranks_per_node=rpn, workers_per_rank=1, worker=0)


class MosaicRank:
    def __init__(self, ds, ids: np.ndarray, rows: int):
        self.ds, self.ids, self.rows, self.pos = ds, ids, rows, 0

    def __next__(self):
        out = []
        for i in self.ids[self.pos:self.pos + self.rows]:
            t = np.frombuffer(self.ds.get_item(int(i))["tokens"], dtype=np.int16).astype(np.int64)
            out.append((t[:-1], t[1:]))
        self.pos += self.rows
        if len(out) < self.rows:
            raise StopIteration  # past the epoch: not reached at these sizes
        return stack(out)


class Mosaic:
    """``StreamingDataset(local=<pre-packed MDS>, batch_size=G/D, shuffle=True, num_canonical_nodes=8)``;
    resume: ``state_dict(step * G, from_beginning=True)`` of the 16-rank run, loaded by every new rank."""

    name = "streaming"
    rule = "state_dict({k}*G) of the {n}-rank run, loaded by every new rank (same num_canonical_nodes)"

    def __init__(self, m: dict, rows: int):
        from .data import mds_rows

        self.m, self.rows, self.mds = m, rows, mds_rows(m)

    def _dataset(self, D: int):
        from streaming import StreamingDataset

        ds = StreamingDataset(local=self.mds, batch_size=self.rows // D, shuffle=True, shuffle_seed=17,
                              num_canonical_nodes=8, shuffle_block_size=1 << 18)
        # The world rank 0 of a D-rank job detects (RANK, WORLD_SIZE, LOCAL_WORLD_SIZE), so that Mosaic's
        # own state_dict records the simulated job's physical node count.
        ds._parallel_rank_world = _world(D)
        return ds

    def open(self, D: int, state=None):
        from streaming.base.batching.random import generate_work_random_batching

        ds = self._dataset(D)
        epoch, sample_in_epoch = 0, 0
        if state is not None:
            ds.load_state_dict(state)
            # Mosaic's own resume: reads the state back and sets num_canonical_nodes, shuffle seed and
            # initial_physical_nodes, exactly as each worker does at the start of __iter__.
            epoch, sample_in_epoch = ds._resume(ds._parallel_rank_world, 0)
        rpn = min(D, RANKS_PER_NODE)
        # What each rank's local leader computes in StreamingDataset._get_work: the whole job's partition.
        work = generate_work_random_batching(ds, _world(D), epoch, sample_in_epoch)
        ds.next_epoch = epoch + 1  # what __iter__ sets (_resume_incr_epoch); state_dict reads it back
        return [MosaicRank(ds, work[r // rpn, r % rpn, 0].flatten(), self.rows // D) for r in range(D)]

    def save(self, ranks, step: int):
        return ranks[0].ds.state_dict(step * self.rows, True)  # rank 0's, as Composer saves it

    def resume(self, state, M: int, step: int):
        return self.open(M, state), "restored"


# ------------------------------------------------------------------------------ Energon

def _energon_encoder(tok_path: str, L: int):
    """A TaskEncoder that tokenizes (documents split into pieces of at most ``L`` tokens) and packs
    first-fit into rows of ``L`` tokens (labels -100 at each piece's first token and at padding)."""
    import megatron.energon as me
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(tok_path)
    eos = tok.token_to_id("<eos>")

    class PackingEncoder(me.DefaultTaskEncoder):
        @me.stateless
        def encode_sample(self, s):
            ids = tok.encode(s.text, add_special_tokens=False).ids + [eos]
            return {"pieces": [np.asarray(ids[i:i + L]) for i in range(0, len(ids), L)]}

        def select_samples_to_pack(self, samples):
            pieces = [{"ids": p} for s in samples for p in s["pieces"]]
            bins, room = [], []
            for p in pieces:
                for j, r in enumerate(room):
                    if len(p["ids"]) <= r:
                        bins[j].append(p)
                        room[j] -= len(p["ids"])
                        break
                else:
                    bins.append([p])
                    room.append(L - len(p["ids"]))
            return bins

        @me.stateless
        def pack_selected_samples(self, samples):
            ids = np.zeros(L, dtype=np.int64)
            labels = np.full(L, -100, dtype=np.int64)
            at = 0
            for p in samples:
                n = len(p["ids"])
                ids[at:at + n] = labels[at:at + n] = p["ids"]
                labels[at] = -100  # nothing predicts a piece's first token from the previous piece
                at += n
            return {"ids": ids, "labels": labels}

        @me.stateless
        def batch(self, packs):
            return {"ids": np.stack([p["ids"] for p in packs]), "labels": np.stack([p["labels"] for p in packs])}

    return PackingEncoder()


class EnergonRank:
    def __init__(self, dl):
        self.dl, self.it = dl, iter(dl)

    def __next__(self):
        b = next(self.it)
        ids, labels = torch.as_tensor(np.asarray(b["ids"])), torch.as_tensor(np.asarray(b["labels"]))
        return ids[:, :-1].long(), labels[:, 1:].long()


class Energon:
    """``get_train_dataset(wds, batch_size=G/D, shuffle_buffer_size=100, max_samples_per_sequence=100,
    packing_buffer_size=16, WorkerConfig(rank, D, num_workers=0))`` + ``get_savable_loader``; resume:
    ``save_state_rank()`` per rank, ``energon checkpoint redist --new-world-size M``, ``restore_state_rank``."""

    name = "energon"
    rule = "save_state_rank per rank, `energon checkpoint redist --new-world-size M`, restore_state_rank"

    def __init__(self, m: dict, rows: int):
        from .data import energon_wds

        self.m, self.rows, self.wds = m, rows, energon_wds(m)
        self.encoder = _energon_encoder(m["tokenizer"], m["seq_len"] + 1)

    def open(self, D: int, state=None):
        import megatron.energon as me

        out = []
        for r in range(D):
            wc = me.WorkerConfig(rank=r, world_size=D, num_workers=0)
            ds = me.get_train_dataset(self.wds, batch_size=self.rows // D, shuffle_buffer_size=100,
                                      max_samples_per_sequence=100, packing_buffer_size=16,
                                      task_encoder=self.encoder, worker_config=wc)
            dl = me.get_savable_loader(ds, worker_config=wc)
            if state is not None:
                try:
                    dl.restore_state_rank(state[r])
                except (ValueError, AssertionError) as e:  # Energon's own checks, either kind
                    raise Refused(f"restore_state_rank: {e}") from None
            out.append(EnergonRank(dl))
        return out

    def save(self, ranks, step: int):
        return [rk.dl.save_state_rank() for rk in ranks]

    def resume(self, state, M: int, step: int):
        with tempfile.TemporaryDirectory() as d:
            files = []
            for r, st in enumerate(state):
                files.append(os.path.join(d, f"state_rank{r}.pt"))
                torch.save(st, files[-1])
            out = os.path.join(d, "out")
            os.makedirs(out)
            exe = os.path.join(os.path.dirname(sys.executable), "energon")
            p = subprocess.run([exe, "checkpoint", "redist", "--new-world-size", str(M), *files, out],
                               capture_output=True, text=True)
            if p.returncode:
                msg = (p.stderr or p.stdout).strip().splitlines()
                raise Refused(f"energon checkpoint redist: {msg[-1] if msg else 'exit ' + str(p.returncode)}")
            new = sorted(glob.glob(os.path.join(out, "*")),
                         key=lambda f: int("".join(c for c in os.path.basename(f) if c.isdigit()) or 0))
            states = [torch.load(f, weights_only=False) for f in new]
        return self.open(M, states), "redistributed"
