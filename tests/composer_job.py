"""A tiny Composer training job on ``zephon_streaming.StreamingDataset`` for the Composer contract tests.

Used two ways by ``test_composer_contract.py``:
  * imported: ``run(...)`` trains in the calling process (one rank, no launcher);
  * as a script under Composer's own launcher (``composer -n N tests/composer_job.py --data ... --out DIR``):
    every rank trains, then writes ``DIR/rank{RANK}.json``.

What a run records (the result dict / JSON file): per training step the epoch, batch index, this rank's
sample ids and tokens and a SHA-256 of the rank batch, as seen by a Callback at ``AFTER_DATALOADER``;
every ``state_dict`` / ``load_state_dict`` call Composer makes on the dataset, with its arguments and a
SHA-256 of the state; the checkpoints written; the warnings raised; the final model weights (SHA-256 of
their bytes, and their values).
"""
from __future__ import annotations

import hashlib
import json
import os
import sys
import warnings

import numpy as np
import torch
from torch.utils.data import DataLoader

from composer import Callback, Event, State, Trainer
from composer.models import ComposerModel
from composer_launch import finish, job_arguments, write_result
from zephon_streaming import StreamingDataset

VOCAB, SEQ, CLASSES = 64, 8, 4
SHUFFLE_SEED, CHUNK = 23, 2


# -- data -----------------------------------------------------------------------------------------
def tokens_of(i: int) -> np.ndarray:
    """The token column of sample ``i`` (a pure function of the id, so the test can check rows)."""
    return np.array([(i * 7 + j * 13 + (i // 5) * j) % VOCAB for j in range(SEQ)], dtype=np.int32)


def write_mds(out: str, n: int, size_limit: int = 1 << 10) -> str:
    """``n`` samples ``{"id": i, "tokens": tokens_of(i)}`` in several MDS shards under ``out/train``
    (written by mosaicml-streaming's own ``MDSWriter``); returns ``out``."""
    from streaming import MDSWriter

    with MDSWriter(out=os.path.join(out, "train"), columns={"id": "int", "tokens": f"ndarray:int32:{SEQ}"},
                   compression="zstd", hashes=["xxh64"], size_limit=size_limit) as w:
        for i in range(n):
            w.write({"id": i, "tokens": tokens_of(i)})
    return out


class ObservedDataset(StreamingDataset):
    """``zephon_streaming.StreamingDataset`` unchanged, recording the state calls Composer makes."""

    def __init__(self, **kw):
        super().__init__(**kw)
        self.calls: list[dict] = []

    def state_dict(self, num_samples, from_beginning):
        st = super().state_dict(num_samples, from_beginning)
        self.calls.append({"call": "state_dict", "num_samples": num_samples, "from_beginning": from_beginning,
                           "epoch": st["epoch"], "sample_in_epoch": st["sample_in_epoch"],
                           "has_lanes": st["loader"] is not None, "bytes": len(json.dumps(st)),
                           "lanes": st["loader"] and sorted(e["lane"] for e in json.loads(st["loader"])["lanes"]),
                           "sha256": hashlib.sha256(json.dumps(st, sort_keys=True).encode()).hexdigest()})
        return st

    def load_state_dict(self, obj):
        self.calls.append({"call": "load_state_dict", "epoch": obj and obj.get("epoch"),
                           "sample_in_epoch": obj and obj.get("sample_in_epoch")})
        super().load_state_dict(obj)


def make_dataset(data: str, batch_size: int) -> ObservedDataset:
    """Per-device ``batch_size``; rank and world size come from the launcher's environment."""
    return ObservedDataset(local=data, split="train", batch_size=batch_size, shuffle=True,
                           shuffle_seed=SHUFFLE_SEED, chunk_size=CHUNK)


# -- model and recording ---------------------------------------------------------------------------
class TinyClassifier(ComposerModel):
    """Embedding + mean pool + linear over the token column; the label is ``id % CLASSES``."""

    def __init__(self):
        super().__init__()
        self.emb = torch.nn.Embedding(VOCAB, 16)
        self.head = torch.nn.Linear(16, CLASSES)

    def forward(self, batch):
        return self.head(self.emb(batch["tokens"].long()).mean(1))

    def loss(self, outputs, batch, *args, **kwargs):
        return torch.nn.functional.cross_entropy(outputs, batch["id"].long() % CLASSES)


def batch_digest(ids, tokens) -> str:
    """SHA-256 of a batch: its sample ids (int64) then its token rows (int32), in batch order. A global
    batch is the concatenation of the ranks' batches in rank order."""
    h = hashlib.sha256()
    h.update(np.asarray(ids, dtype=np.int64).tobytes())
    h.update(np.asarray(tokens, dtype=np.int32).reshape(-1, SEQ).tobytes())
    return h.hexdigest()


class BatchRecorder(Callback):
    """Per step: epoch, batch (global count), batch_in_epoch (0-based), this rank's ids, tokens and digest."""

    def __init__(self):
        self.steps: list[dict] = []

    def after_dataloader(self, state: State, logger) -> None:
        ids, tokens = state.batch["id"].tolist(), state.batch["tokens"].tolist()
        self.steps.append({"epoch": int(state.timestamp.epoch), "batch": int(state.timestamp.batch),
                           "batch_in_epoch": int(state.timestamp.batch_in_epoch), "ids": ids, "tokens": tokens,
                           "digest": batch_digest(ids, tokens)})


def weights_of(model: torch.nn.Module) -> tuple[str, list[float]]:
    """(SHA-256 of the parameters' bytes, their values flattened): bit identity and closeness."""
    h, flat = hashlib.sha256(), []
    for name, t in sorted(model.state_dict().items()):
        a = t.detach().cpu().contiguous().numpy()
        h.update(name.encode())
        h.update(a.tobytes())
        flat.extend(a.ravel().tolist())
    return h.hexdigest(), flat


def save_schedule(spec):
    """``"at:3,14,ep"``: checkpoint after global batches 3 and 14 and at every epoch end (a Composer
    ``save_interval`` callable); anything else is passed to Composer as is (``"3ba"``, ``"1ep"``)."""
    if not (isinstance(spec, str) and spec.startswith("at:")):
        return spec
    parts = spec[3:].split(",")
    batches = {int(p) for p in parts if p.isdigit()}
    epochs = "ep" in parts

    def due(state: State, event: Event) -> bool:
        if event == Event.BATCH_CHECKPOINT:
            return int(state.timestamp.batch) in batches
        return epochs and event == Event.EPOCH_CHECKPOINT

    return due


# -- one run --------------------------------------------------------------------------------------
def run(data: str, *, batch_size: int, max_duration: str, num_workers: int = 0, save_folder: str | None = None,
        save_interval=None, load_path: str | None = None, seed: int = 17, loader: str = "torch") -> dict:
    """Train ``TinyClassifier`` with ``composer.Trainer`` on CPU over ``data`` (MDS); returns the record.
    ``loader``: ``"torch"`` (``torch.utils.data.DataLoader``) or ``"streaming"`` (``StreamingDataLoader``)."""
    torch.manual_seed(0)  # the initial weights: identical in every run and on every rank
    ds = make_dataset(data, batch_size)
    if loader == "streaming":
        from zephon_streaming import StreamingDataLoader

        dl = StreamingDataLoader(ds, batch_size=batch_size, num_workers=num_workers)
    else:
        dl = DataLoader(ds, batch_size=batch_size, num_workers=num_workers)
    model = TinyClassifier()
    rec = BatchRecorder()
    kw = {}
    if save_folder is not None:
        kw.update(save_folder=save_folder, save_interval=save_schedule(save_interval), save_overwrite=True)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer = Trainer(model=model, train_dataloader=dl, max_duration=max_duration, device="cpu",
                          optimizers=torch.optim.SGD(model.parameters(), lr=0.5, momentum=0.9),
                          callbacks=[rec], load_path=load_path, seed=seed, progress_bar=False,
                          log_to_console=False, loggers=[], **kw)
        trainer.fit()
    digest, values = weights_of(trainer.state.model)
    out = {"rank": ds.rank, "world_size": ds.world_size, "len": len(ds), "dataloader_len": len(dl),
           "steps_per_epoch": ds.steps_per_epoch, "repeated_per_epoch": ds.repeated_per_epoch,
           "num_canonical_nodes": ds.num_canonical_nodes, "global_batch_size": ds.global_batch_size,
           "steps": rec.steps, "calls": ds.calls, "weights": digest, "weight_values": values,
           "warnings": sorted({" ".join(str(w.message).split())[:240] for w in caught})}
    return {**out, **finish(trainer, ds, save_folder)}


def main(argv=None) -> int:
    p = job_arguments(__doc__.splitlines()[0])
    p.add_argument("--loader", choices=("torch", "streaming"), default="torch")
    a = p.parse_args(argv)
    res = run(a.data, batch_size=a.batch_size, max_duration=a.max_duration, num_workers=a.workers,
              save_folder=a.save_folder, save_interval=a.save_interval, load_path=a.load_path, loader=a.loader)
    write_result(a.out, res)
    return 0


if __name__ == "__main__":
    sys.exit(main())
