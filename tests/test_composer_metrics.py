"""``zephon_streaming.ZephonMetrics`` inside a real ``composer.Trainer`` (CPU, a tiny model, a few batches): Composer's
own ``InMemoryLogger`` receives ``Loader.metrics()`` every ``n`` batches, and each logged value equals the counts made
here from the batches the Trainer trained on (rows, tokens, and per dataset the documents and tokens: the datasets'
texts use disjoint bytes, each document starts with its dataset's marker byte).

Row ``composer.metrics`` of compat_matrix/contracts.py; runs where Composer is installed
(``python -m compat_matrix run --env composer-0.32.1``)."""
from __future__ import annotations

import json

import pytest

pytest.importorskip("composer", reason="mosaicml (Composer) 0.32.1 not installed: it needs torch<2.7.1; run "
                                       "`python -m compat_matrix run --env composer-0.32.1`")

import torch  # noqa: E402
from composer import Callback, Trainer  # noqa: E402
from composer.loggers import InMemoryLogger  # noqa: E402
from composer.models import ComposerModel  # noqa: E402

from zephon import Batch, Decode, Loader, Pack, Tokenize, open_dataset  # noqa: E402
from zephon_streaming import ZephonMetrics  # noqa: E402
from zephon_torch.dataset import to_torch  # noqa: E402

EOS, OFFSET, L = 2, 3, 32  # the byte tokenizer: byte b is token b + 3
WEB, CODE = b"Wabcdefghij ", b"C0123456789"
BATCHES, EVERY = 6, 2


class Rows(torch.utils.data.IterableDataset):
    """The loader's micro-batches as tensors (what a training loop reads), in the loader's order."""

    def __init__(self, loader):
        super().__init__()
        self.loader = loader

    def __iter__(self):
        for mb in self.loader:
            yield {k: v for k, v in to_torch(mb).items() if k in ("input_ids", "labels", "attention_mask")}


class TinyLM(ComposerModel):
    def __init__(self):
        super().__init__()
        self.emb = torch.nn.Embedding(256 + OFFSET, 8)
        self.head = torch.nn.Linear(8, 256 + OFFSET)

    def forward(self, batch):
        return self.head(self.emb(batch["input_ids"].long()))

    def loss(self, outputs, batch, *args, **kwargs):
        return torch.nn.functional.cross_entropy(outputs.flatten(0, 1), batch["labels"].long().flatten(),
                                                 ignore_index=-100)


class Counter(Callback):
    """Per trained batch: rows, tokens and, per dataset, documents (marker bytes) and tokens (an EOS is its
    document's: best-fit rows never cut a document)."""

    def __init__(self):
        self.after: list[dict] = []  # cumulative counts after each batch
        self.total = {"rows": 0, "tokens": 0, "web": [0, 0], "code": [0, 0]}

    def after_dataloader(self, state, logger) -> None:
        b = state.batch
        for ids, mask in zip(b["input_ids"].tolist(), b["attention_mask"].tolist()):
            self.total["rows"] += 1
            last = None
            for t, m in zip(ids, mask):
                if not m:
                    continue
                name = last if t == EOS else ("web" if t - OFFSET in WEB else "code")
                self.total[name][0] += t != EOS and t - OFFSET in b"WC"
                self.total[name][1] += 1
                self.total["tokens"] += 1
                last = name
        self.after.append(json.loads(json.dumps(self.total)))


@pytest.mark.contract("composer.metrics")
def test_composer_trainer_logger_receives_the_loader_metrics(tmp_path):
    for name, alphabet in (("web", WEB), ("code", CODE)):
        (tmp_path / name).mkdir()
        docs = [chr(alphabet[0]) + "".join(chr(alphabet[1 + (i * 7 + j) % (len(alphabet) - 1)])
                                           for j in range(3 + i % 17)) for i in range(60)]
        (tmp_path / name / "a.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in docs))
    datasets = [open_dataset(str(tmp_path / name)) for name in ("web", "code")]
    loader = Loader(datasets, [Decode(), Tokenize("bytes", eos_id=EOS, max_length=L), Pack(L), Batch(4)],
                    weights=[1, 1], canonical_replicas=2, global_batch_size=8, chunk_size=16, runner="inline")
    torch.manual_seed(0)
    model, counter, log = TinyLM(), Counter(), InMemoryLogger()
    trainer = Trainer(model=model, train_dataloader=torch.utils.data.DataLoader(Rows(loader), batch_size=None),
                      max_duration=f"{BATCHES}ba", device="cpu", optimizers=torch.optim.SGD(model.parameters(), lr=0.1),
                      callbacks=[counter, ZephonMetrics(loader.metrics, every_n_batches=EVERY)], loggers=[log],
                      device_train_microbatch_size=4, progress_bar=False, log_to_console=False, seed=1)
    trainer.fit()
    assert len(counter.after) == BATCHES
    logged = {k: [(int(ts.batch), v) for ts, v in series] for k, series in log.data.items() if k.startswith("zephon/")}
    batches = [b for b, _ in logged["zephon/rows"]]
    assert batches[:BATCHES // EVERY] == list(range(EVERY, BATCHES + 1, EVERY))  # every EVERY batches (then epoch end)
    for k, b in enumerate(batches[:BATCHES // EVERY]):
        seen = counter.after[b - 1]  # what the model had trained on when the callback ran
        assert logged["zephon/rows"][k][1] == seen["rows"] == b * 4
        assert logged["zephon/tokens"][k][1] == seen["tokens"]
        for name in ("web", "code"):
            assert logged[f"zephon/datasets/{name}/samples"][k][1] == seen[name][0]
            assert logged[f"zephon/datasets/{name}/tokens"][k][1] == seen[name][1]
    trainer.close()
