"""The vision-language pipeline of the stall benchmark (``python -m benchmarks --only stall --pipeline vl``).

Data: ``VL_SAMPLES`` natural-looking JPEGs (300-640 px a side) with captions, written once under the workdir by
the peers' own writers (``benchmarks/freethreaded.py``'s ``prepare``: ``streaming.MDSWriter``, and
``webdataset`` + ``energon prepare``); the loop reads the MDS copy. Pipeline: ``vision_language_ops`` (DecodeImage,
RandomResizedCrop to 224 x 224, Normalize, CaptionTokens with the demo's BPE, 64 tokens) + ``Batch``; a step is
``VL_STEP_IMAGES`` images (the free-threaded benchmark's global batch): ``lanes`` micro-batches of
``VL_STEP_IMAGES // lanes`` images (``zephon_torch``'s DataLoader yields the step as one item). The unit of the
loader's rate is an image. Configurations: the core runners (``zephon.Loader``), ``zephon_torch`` (its
DataLoader, 2 workers, inline runner in each) and ``zephon_streaming`` (its ``StreamingDataset`` over the MDS,
batch 8, 2 workers, the same operators in the DataLoader's ``collate_fn``, as a Mosaic user's transform: 8
batches a step) and ``zephon_energon`` (``get_train_dataset`` over the Energon copy, whose decoder gives float
tensors; a TaskEncoder crops, resizes and normalizes them with torchvision and tokenizes the captions with
``CaptionTokens``, as an Energon user's would; batch 8, 2 workers, 8 batches a step).
"""
from __future__ import annotations

VL_CONFIGS = ("inline", "threads", "processes", "zephon_torch", "zephon_streaming", "zephon_energon")
VL_SAMPLES, VL_SAMPLES_QUICK = 512, 64
VL_STEP_IMAGES = 64


def prepare_vl(workdir: str, quick: bool) -> dict:
    """The MDS and Energon copies of the VL samples (written once; see ``benchmarks.freethreaded.prepare``)."""
    from .freethreaded import prepare

    return prepare(workdir, VL_SAMPLES_QUICK if quick else VL_SAMPLES)


def _images(mb) -> int:
    return len(mb["pixel_values"])


class _Collate:
    """A DataLoader ``collate_fn``: MDS samples (``jpeg`` a PIL image, ``caption``) through ``ops``, stacked."""

    def __init__(self, ops):
        self.ops, self.seen = ops, 0

    def __call__(self, samples):
        import numpy as np

        # the operators key their crops by a source pointer: a running count stands in for one
        recs = [dict(s, __src__=(0, 0, self.seen + k)) for k, s in enumerate(samples)]
        self.seen += len(samples)
        for op in self.ops:
            recs = op.process_many(recs)
        return {k: np.stack([r[k] for r in recs]) for k in ("pixel_values", "input_ids", "attention_mask")}


def _energon_encoder_cls(mod):
    """A TaskEncoder (subclass of ``mod.DefaultTaskEncoder``) for CaptioningSample: image -> 224 x 224 crop,
    normalized; caption -> ``CaptionTokens`` ids; batches ``{"pixel_values", "input_ids", "attention_mask"}``."""
    import numpy as np
    import torch
    from torchvision.transforms import v2

    from zephon.ops.vision import CaptionTokens

    class VLEncoder(mod.DefaultTaskEncoder):
        def __init__(self, tok_path):
            super().__init__()
            self.crop = v2.Compose([v2.RandomResizedCrop(224, antialias=True),
                                    v2.Normalize([0.485, 0.456, 0.406], [0.229, 0.224, 0.225])])
            self.captions = CaptionTokens(tok_path, max_length=64)

        def encode_sample(self, sample):
            return self.crop(sample.image), sample.caption

        def batch(self, samples):
            rows = self.captions.process_many([{"caption": c} for _, c in samples])
            return {"pixel_values": torch.stack([p for p, _ in samples]),
                    **{k: torch.from_numpy(np.stack([r[k] for r in rows])) for k in ("input_ids", "attention_mask")}}

        def encode_batch(self, batch):
            return batch

    return VLEncoder


def _epochs(dl):
    while True:  # Mosaic's loader is one epoch per iteration; a training loop starts the next
        yield from dl


def vl_iterator(cfg):
    """``(iterator, items per step, count(item) -> images, "images")`` for ``cfg["config"]`` over ``cfg["vl"]``.

    cfg: the stall child's configuration (``config``, ``lanes``, ``tokenizer``, ``vl``: ``prepare_vl``'s result).
    Raises ValueError for a configuration outside ``VL_CONFIGS`` or lanes that do not divide ``VL_STEP_IMAGES``.
    """
    from zephon.formats import open_dataset
    from zephon.ops import Batch, vision_language_ops

    name, lanes = cfg["config"], cfg["lanes"]
    if name not in VL_CONFIGS:
        raise ValueError(f"configuration {name!r} has no vision-language pipeline; choose from {VL_CONFIGS}")
    if VL_STEP_IMAGES % lanes:
        raise ValueError(f"--lanes {lanes} must divide the VL step of {VL_STEP_IMAGES} images")
    micro = VL_STEP_IMAGES // lanes
    if name == "zephon_streaming":
        from zephon_streaming import StreamingDataLoader, StreamingDataset

        ds = StreamingDataset(local=cfg["vl"]["mds"], batch_size=8, shuffle=True, shuffle_seed=17)
        collate = _Collate(vision_language_ops(image="jpeg", caption="caption", tokenizer=cfg["tokenizer"],
                                               max_length=64))
        dl = StreamingDataLoader(ds, batch_size=8, num_workers=2, prefetch_factor=4, collate_fn=collate)
        return _epochs(dl), VL_STEP_IMAGES // 8, _images, "images"
    if name == "zephon_energon":
        import zephon_energon as mod

        wc = mod.WorkerConfig(rank=0, world_size=1, num_workers=2)
        ds = mod.get_train_dataset(cfg["vl"]["energon"], worker_config=wc, batch_size=8, shuffle_buffer_size=100,
                                   max_samples_per_sequence=100,
                                   task_encoder=_energon_encoder_cls(mod)(cfg["tokenizer"]))
        return iter(mod.get_loader(ds, worker_config=wc, prefetch_factor=4)), VL_STEP_IMAGES // 8, _images, "images"
    datasets = [open_dataset(cfg["vl"]["mds"], format="mds")]
    ops = vision_language_ops(image="jpeg", caption="caption", tokenizer=cfg["tokenizer"], max_length=64)
    ops.append(Batch(micro))
    common = {"seed": 0, "canonical_replicas": lanes, "chunk_size": 64, "global_batch_size": VL_STEP_IMAGES,
              "unit_size": 16}
    if name == "zephon_torch":
        from zephon_torch import DataLoader, ZephonIterableDataset

        ds = ZephonIterableDataset(datasets, ops, dp_degree=1, dp_rank=0, **common)
        # its DataLoader hands over a step's rows as one item (64 images), not one item per lane
        return iter(DataLoader(ds, batch_size=None, num_workers=2, prefetch_factor=4)), 1, _images, "images"
    from zephon.engine import Loader

    return iter(Loader(datasets, ops, runner=name, num_workers=2, **common)), lanes, _images, "images"
