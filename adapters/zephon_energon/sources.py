"""Where a dataset's samples come from: a prepared dataset directory or a metadataset YAML, opened as Zephon
datasets with the mixture weights Energon's ``blend`` / ``blend_epochized`` give them. See docs/energon.md.
"""
from __future__ import annotations

import os

from .keywords import refuse


def _open_sources(path, split_part, kwargs):
    """``[(zephon Dataset, SampleFactory-args, weight, repetitions)]`` for a prepared dataset directory or
    a metadataset YAML."""
    from zephon.formats import open_dataset
    try:
        from zephon.formats import energon as efmt
    except ImportError as e:  # pragma: no cover - the reader ships with the core
        raise ImportError("zephon.formats.energon (the Energon-prepared WebDataset reader) is missing") from e

    path = os.fspath(path)
    if os.path.isfile(path) and path.endswith(".jsonl"):
        entries = [efmt.jsonl_leaf(path)]
    elif os.path.isfile(path):
        entries = efmt.load_metadataset(path, split_part)
    else:
        entries = [{"path": path, "weight": None, "subset": None, "repetitions": None, "subflavors": None,
                    "split_part": split_part}]
    out = []
    for e in entries:
        if e.get("jsonl"):  # one file, one shard: the sample index is Energon's key
            out.append((open_dataset(e["path"], format="jsonl"), e))
            continue
        if e.get("join"):  # the core matches the members by key; _join.JoinFactory builds the samples
            members = [open_dataset(m["path"], format="energon", split_part=m["split_part"], decode=False)
                       for m in e["join"]["members"]]
            out.append((efmt.JoinedWebdataset(members, [m["nonmatch"] for m in e["join"]["members"]],
                                              name=f"join:{e['path']}"), e))
            continue
        # Raw parts: the task encoder's own decoder (Energon's SampleDecoder) decodes them on the workers.
        open_kwargs = {"format": "energon", "split_part": e.get("split_part") or split_part, "decode": False}
        if e.get("subset"):
            open_kwargs["subset"] = e["subset"]
        ds = open_dataset(e["path"], **open_kwargs)  # no __fields__ without decoding: SampleFactory maps them
        out.append((ds, e))
    return out


def _weights(sources, repeat: bool, schedule_step_size=None):
    """Core datasets, mixture weights and whether they are per-pass quotas (``exhaustion="quota"``):
    ``blend`` weights as given; ``blend_epochized`` whole repetitions r list the dataset r times, each
    weighted by its size, so one pass of the mixture is r passes of that dataset; fractional ones give
    each dataset once with a quota of ``floor(r x size)`` draws per pass, continuing its own stream of
    shuffled passes (Energon's per-epoch fraction: each epoch takes the next part). A blend weight schedule
    (``{step: ...}`` / ``{linear: ...}``) gives a ``zephon.work.Schedule`` whose steps hold
    ``schedule_step_size`` samples (None: the loader's global batch, one batch per lane)."""
    reps = [e.get("repetitions") for _, e in sources]
    if any(r is not None and r != int(r) for r in reps):
        return _quotas(sources, reps) + (True,)
    if any(r not in (None, 1) for r in reps):
        datasets, weights, metas = [], [], []
        for (ds, e), r in zip(sources, reps):
            r = 1 if r is None else r
            if r < 1:
                refuse("blend_epochized repetitions", f"{r} for {e['path']}: repetitions must be > 0")
            for _ in range(int(r)):
                datasets.append(ds)
                weights.append(ds.num_samples)
                metas.append(e)
        return datasets, weights, metas, False
    ws = [e.get("weight") for _, e in sources]
    if any(isinstance(w, dict) for w in ws):
        if not repeat:
            refuse("repeat=False", "a weight schedule needs an endless blend (repeat=True)")
        from zephon.work import Schedule
        return [ds for ds, _ in sources], Schedule([1.0 if w is None else w for w in ws],
                                                   positions_per_step=schedule_step_size), \
            [e for _, e in sources], False
    if len(sources) > 1 and any(w is not None for w in ws):
        if not repeat:
            refuse("repeat=False", "a weighted blend repeats its datasets (Energon asserts repeat=True for blends too)")
        weights = [1.0 if w is None else float(w) for w in ws]
    elif len(sources) > 1:  # no weights (a concatenation): proportional to size, one pass of each
        weights = [ds.num_samples for ds, _ in sources]
    else:
        weights = None
    return [ds for ds, _ in sources], weights, [e for _, e in sources], False


def _quotas(sources, reps):
    """``(datasets, quotas, metas)`` of a ``blend_epochized`` with a fractional repetition: each dataset once,
    ``floor(r x size)`` draws per pass. Raises ``RefusedKeyword`` for a quota of no sample."""
    quotas = []
    for (ds, e), r in zip(sources, reps):
        r = 1 if r is None else r
        q = int(r * ds.num_samples)  # floor, as Energon's RepeatDataset stops after floor(len x fraction)
        if q < 1:
            refuse("blend_epochized repetitions", f"{r} for {e['path']} ({ds.num_samples} samples) gives no sample "
                   f"per epoch; use a larger repetition or leave the dataset out")
        quotas.append(q)
    return [ds for ds, _ in sources], quotas, [e for _, e in sources]
