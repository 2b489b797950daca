"""Samples of a ``join`` metadataset: each member's Energon sample (its own dataset.yaml), then the joiner.

As Energon's ``JoinedWebdatasetFactory.load_sample``: every member record is loaded by its dataset's own
``field_map`` / sample type (``None`` where ``nonmatch: none`` found no match), then combined by the
joiner: a Sample type's ``from_joined`` or a function, given the samples positionally (a list join) or by
name (a mapping join). The joining itself (matching keys) is the core's ``JoinedWebdataset``.
"""
from __future__ import annotations

import importlib

from megatron.energon import Sample

from zephon.formats.energon import JOIN

from ._samples import SampleFactory, resolve_sample_type


def resolve_joiner(spec: dict):
    """The joiner callable of a YAML joiner spec: ``{__module__, __class__}`` (a Sample type: its
    ``from_joined``) or ``{__module__, __function__}``. Raises ValueError when it does not import."""
    if "__function__" in spec:
        try:
            return getattr(importlib.import_module(spec["__module__"]), spec["__function__"])
        except (ImportError, AttributeError) as e:
            raise ValueError(f"join joiner {spec!r} cannot be imported: {e}") from None
    cls = resolve_sample_type(spec)
    return cls.from_joined if isinstance(cls, type) and issubclass(cls, Sample) else cls


class JoinFactory:
    """Builds one joined sample from a ``JoinedWebdataset`` record (see the module docstring).

    ds: the core ``JoinedWebdataset``. entry: its metadataset leaf (``join``: members, names, joiner spec;
    ``subflavors``: merged into every member's sample, as Energon passes them to each member)."""

    def __init__(self, ds, entry: dict):
        join = entry["join"]
        self.parts = [SampleFactory(m.root, getattr(m, "energon", {}) or {}, entry.get("subflavors"))
                      for m in ds.members]
        self.names, self.spec = join.get("names"), dict(join["joiner"])
        self.joiner = resolve_joiner(self.spec)

    def fingerprint(self) -> dict:
        return {"join": [p.fingerprint() for p in self.parts], "names": self.names, "joiner": self.spec}

    def __call__(self, record: dict, decoder=None):
        samples = [None if r is None else f(r, decoder) for f, r in zip(self.parts, record[JOIN])]
        if self.names is not None:
            return self.joiner(**dict(zip(self.names, samples)))
        return self.joiner(*samples)
