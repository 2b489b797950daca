"""llm-foundry's own text dataloader on ``zephon_streaming`` in a real ``composer.Trainer``, for
``test_llmfoundry_contract.py``: imported (one rank, in the calling process) or run under Composer's launcher
(``python -m composer.cli -n N tests/llmfoundry_job.py --data ... --out DIR``; each rank writes ``rank{RANK}.json``).

The swap a user makes (docs/streaming.md): before llmfoundry is imported, ``streaming.StreamingDataset`` and
``streaming.Stream`` are zephon_streaming's, so ``llmfoundry.data.text_data.StreamingTextDataset`` (which subclasses
``streaming.StreamingDataset`` and tokenizes in ``__getitem__``) and ``build_text_dataloader`` run on Zephon.

A run records per training step the epoch, batch index and this rank's ``input_ids`` rows (the test maps each row
back to its sample id with its own tokenization of the corpus), plus the dataset's class chain and lengths.
"""
from __future__ import annotations

import os
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # the tokenizer is a local file: no Hub download may happen

import streaming  # noqa: E402
import zephon_streaming  # noqa: E402

streaming.StreamingDataset, streaming.Stream = zephon_streaming.StreamingDataset, zephon_streaming.Stream

import torch  # noqa: E402
from composer import Callback, State, Trainer  # noqa: E402
from composer.models import ComposerModel  # noqa: E402
from llmfoundry.data.text_data import StreamingTextDataset, build_text_dataloader  # noqa: E402

if not issubclass(StreamingTextDataset, zephon_streaming.StreamingDataset):
    raise RuntimeError("llmfoundry was imported before streaming.StreamingDataset was swapped for zephon_streaming's: "
                       "its StreamingTextDataset still subclasses mosaicml-streaming's; make the swap first")

from composer_job import save_schedule, weights_of  # noqa: E402
from composer_launch import finish, job_arguments, write_result  # noqa: E402

SEQ, SHUFFLE_SEED = 16, 31


def load_tokenizer(path: str):
    """A ``transformers`` fast tokenizer over the local ``tokenizers`` file ``path`` (the demo BPE's specials)."""
    from transformers import PreTrainedTokenizerFast

    return PreTrainedTokenizerFast(tokenizer_file=path, pad_token="<pad>", eos_token="<eos>", bos_token="<bos>",
                                   unk_token="<unk>", model_max_length=SEQ)


def dataset_cfg(data: str, eos_token_id: int) -> dict:
    """The ``train_loader.dataset`` section of an llm-foundry YAML, as a user writes it."""
    return {"local": data, "split": "train", "shuffle": True, "shuffle_seed": SHUFFLE_SEED, "max_seq_len": SEQ,
            "eos_token_id": eos_token_id}


class TinyLM(ComposerModel):
    """Embedding + linear next-token model over ``input_ids`` / ``labels`` (-100: ignored)."""

    def __init__(self, vocab: int):
        super().__init__()
        self.emb = torch.nn.Embedding(vocab, 16)
        self.head = torch.nn.Linear(16, vocab)

    def forward(self, batch):
        return self.head(self.emb(batch["input_ids"]))

    def loss(self, outputs, batch, *args, **kwargs):
        logits, labels = outputs[:, :-1].reshape(-1, outputs.shape[-1]), batch["labels"][:, 1:].reshape(-1)
        return torch.nn.functional.cross_entropy(logits, labels, ignore_index=-100)


class RowRecorder(Callback):
    """Per step: epoch, batch (global count), batch_in_epoch and this rank's ``input_ids`` rows."""

    def __init__(self):
        self.steps: list[dict] = []

    def after_dataloader(self, state: State, logger) -> None:
        self.steps.append({"epoch": int(state.timestamp.epoch), "batch": int(state.timestamp.batch),
                           "batch_in_epoch": int(state.timestamp.batch_in_epoch),
                           "rows": state.batch["input_ids"].tolist()})


def run(data: str, tokenizer: str, *, batch_size: int, max_duration: str, num_workers: int = 0,
        save_folder: str | None = None, save_interval=None, load_path: str | None = None) -> dict:
    """Train ``TinyLM`` on CPU with the dataloader llm-foundry's ``build_text_dataloader`` builds over ``data``
    (MDS with a ``text`` column); returns the record. batch_size: per device."""
    torch.manual_seed(0)
    tok = load_tokenizer(tokenizer)
    spec = build_text_dataloader(tokenizer=tok, device_batch_size=batch_size,
                                 dataset=dataset_cfg(data, tok.eos_token_id), drop_last=True,
                                 num_workers=num_workers, prefetch_factor=2 if num_workers else None,
                                 persistent_workers=num_workers > 0)
    dl = spec.dataloader
    ds = dl.dataset
    rec = RowRecorder()
    kw = {}
    if save_folder is not None:
        kw.update(save_folder=save_folder, save_interval=save_schedule(save_interval), save_overwrite=True)
    model = TinyLM(len(tok))
    trainer = Trainer(model=model, train_dataloader=spec, max_duration=max_duration, device="cpu",
                      optimizers=torch.optim.SGD(model.parameters(), lr=0.1), callbacks=[rec],
                      load_path=load_path, seed=17, progress_bar=False, log_to_console=False, loggers=[], **kw)
    trainer.fit()
    out = {"rank": ds.rank, "world_size": ds.world_size, "len": len(ds), "dataloader_len": len(dl),
           "classes": [f"{c.__module__}.{c.__qualname__}" for c in type(ds).__mro__],
           "steps": rec.steps, "weights": weights_of(trainer.state.model)[0]}
    return {**out, **finish(trainer, ds, save_folder)}


def main(argv=None) -> int:
    p = job_arguments(__doc__.splitlines()[0])
    p.add_argument("--tokenizer", required=True)
    a = p.parse_args(argv)
    write_result(a.out, run(a.data, a.tokenizer, batch_size=a.batch_size, max_duration=a.max_duration,
                            num_workers=a.workers, save_folder=a.save_folder, save_interval=a.save_interval,
                            load_path=a.load_path))
    return 0


if __name__ == "__main__":
    sys.exit(main())
