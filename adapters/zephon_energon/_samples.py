"""Energon samples from reader records, and the stateless ``encode_sample`` stage (workers, any order).

``EncodeSamples`` turns a reader record of an Energon-prepared dataset (``{"__key__", "__restore_key__",
"__shard__", "__parts__"}``) into the dataset's Energon sample (``TextSample``, ``CaptioningSample``, ...
from ``field_map``; a ``CrudeSample`` cooked by the task encoder's cookers), then runs ``encode_sample``
(or ``preencode_sample``; ``postencode_sample`` too when there is no packing). See docs/energon.md.
"""
from __future__ import annotations

import dataclasses
import importlib

from megatron.energon import CrudeSample
from megatron.energon.epathlib import EPath
from megatron.energon.flavors.webdataset.field_access import field_access, split_field_access
from megatron.energon.source_info import SourceInfo

from zephon.formats.energon.pyhooks import DatasetFunction
from zephon.formats.records import SRC
from zephon.ops import Operator, RecordError

from ._hooks import SKIP, call_hook, energon_context, expand_result, fn_name, overridden, qualname
from .keywords import refuse

def resolve_sample_type(spec):
    """The sample class from a dataset.yaml ``sample_type`` (``{"__module__", "__class__"}``), a class,
    or a dotted name."""
    if isinstance(spec, type):
        return spec
    if isinstance(spec, dict):
        module, name = spec.get("__module__"), spec.get("__class__")
    else:
        module, _, name = str(spec).rpartition(".")
    try:
        return getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError) as e:
        raise ValueError(f"dataset.yaml sample_type {spec!r} cannot be imported: {e}") from None


#: dataset.yaml ``__class__`` values that are Energon's own factories (None: the sample_type form).
_ENERGON_FACTORIES = {None, "StandardWebdatasetFactory", "DefaultDecoderWebdatasetFactory",
                      "DefaultGenericWebdatasetFactory", "CrudeWebdataset"}


class SampleFactory:
    """Builds one dataset's Energon samples from reader records, as Energon's
    ``DefaultGenericWebdatasetFactory.load_sample`` does: ``field_map`` entries (``json[caption]``
    paths, ``jpg,png`` alternatives) through Energon's own ``field_access``; crude datasets give a
    ``CrudeSample`` of every part. ``__key__``, ``__restore_key__``, ``__subflavors__`` and
    ``__sources__`` are set as Energon sets them."""

    def __init__(self, path: str, meta: dict, subflavors: dict | None = None):
        self.path = str(path)
        if meta.get("class") not in _ENERGON_FACTORIES:  # a user's factory subclass: its Python is not run here
            refuse(f"dataset class {meta.get('class')!r}", f"{self.path}: dataset.yaml names a Python dataset class "
                   f"(a subclass of Energon's DefaultDecoderWebdatasetFactory, say); zephon_energon reads "
                   f"sample_type + field_map datasets and CrudeWebdataset ones: write a sample_type + field_map "
                   f"dataset.yaml, or make it a CrudeWebdataset and build the sample in a cooker")
        self.crude = bool(meta.get("crude"))
        self.subflavors = dict(meta.get("subflavors") or {})
        self.subflavors.update(subflavors or {})
        self.sample_type = CrudeSample if self.crude else resolve_sample_type(meta.get("sample_type"))
        fm = meta.get("field_map")
        # dataset.yaml Python hooks (loaded as Energon loads them; run here, on the workers)
        pf, sl = meta.get("part_filter"), meta.get("sample_loader")
        self.part_fn = DatasetFunction(self.path, pf, "part_filter") if isinstance(pf, str) else None
        self.loader = DatasetFunction(self.path, sl, "sample_loader") if sl and not self.crude else None
        if self.loader is not None and pf is None:
            raise ValueError(f"{self.path}: dataset.yaml has a sample_loader but no part_filter (Energon requires "
                             f"both)")
        if not self.crude and not fm and self.loader is None:
            raise ValueError(f"{self.path}: dataset.yaml has neither a field_map, a sample_loader nor a crude sample "
                             f"type")
        self.field_map = dict(fm or {})
        self._fields = {k: split_field_access(v) for k, v in self.field_map.items()}
        if not self.crude and self.loader is None:
            names = {f.name for f in dataclasses.fields(self.sample_type)}
            extra = sorted(set(self._fields) - names)
            if extra:
                raise ValueError(f"{self.path}: field_map keys {extra} are not fields of "
                                 f"{self.sample_type.__name__}")

    def fingerprint(self) -> dict:
        return {"sample_type": qualname(self.sample_type), "field_map": self.field_map,
                "subflavors": repr(sorted(self.subflavors.items())), "crude": self.crude,
                **{k: h.fingerprint() for k, h in (("sample_loader", self.loader), ("part_filter", self.part_fn))
                   if h is not None}}

    def __call__(self, record: dict, decoder=None):
        parts = record["__parts__"]
        if self.part_fn is not None:  # Energon filters the parts before decoding
            parts = {k: v for k, v in parts.items() if self.part_fn(k)}
        if decoder is not None:  # Energon's own SampleDecoder on the raw parts (webdataset autodecode)
            try:
                parts = decoder({"__key__": record["__key__"], **parts})
                parts.pop("__key__", None)
            except Exception as e:
                raise RecordError(f"sample {record['__key__']!r}: a part does not decode with the task encoder's "
                                  f"decoder: {type(e).__name__}: {e}", record) from None
        key = record["__key__"]
        rk = record["__restore_key__"]
        rk = tuple(rk) if isinstance(rk, list) else rk
        src = (SourceInfo(dataset_path=EPath(self.path), index=rk[-1] if isinstance(rk, tuple) else rk,
                          shard_name=record.get("__shard__", ""),
                          file_names=tuple(f"{key}.{p}" for p in parts)),)
        if self.crude:
            return CrudeSample(__key__=key, **parts, __restore_key__=rk, __subflavors__=self.subflavors,
                               __sources__=src)
        if self.loader is not None:  # as Energon's DefaultGenericWebdatasetFactory with a sample_loader
            raw = {"__key__": key, "__shard__": record.get("__shard__", ""), "__restore_key__": rk,
                   "__sources__": src, **parts}
            try:
                values = self.loader(raw)
            except Exception as e:
                raise RecordError(f"sample {key!r}: sample_loader {self.loader.spec!r} failed: {type(e).__name__}: "
                                  f"{e}", record) from None
            return self.sample_type(**{"__key__": key, **values, "__restore_key__": rk,
                                       "__subflavors__": self.subflavors, "__sources__": src})
        values = {}
        for name, access in self._fields.items():
            try:
                values[name] = field_access(parts, access)
            except Exception as e:
                raise RecordError(f"sample {key!r}: field_map {name}: {self.field_map[name]!r} cannot be read "
                                  f"({type(e).__name__}: {e}); parts present: {sorted(parts)}", record) from None
        return self.sample_type(__key__=key, __restore_key__=rk, __subflavors__=self.subflavors,
                                __sources__=src, **values)


class JsonlFactory:
    """Crude samples of a JSONL file as Energon 7.2+'s ``DefaultCrudeJsonlDatasetFactory`` gives them:
    ``CrudeSample(__key__=str(line index), json=the object, __restore_key__=("Webdataset", index),
    __subflavors__)``; the task encoder's cookers turn them into samples."""

    crude = True

    def __init__(self, path: str, subflavors: dict | None = None):
        self.path = str(path)
        self.subflavors = dict(subflavors) if subflavors else None  # as Energon: None when none were given

    def fingerprint(self) -> dict:
        return {"jsonl": True, "subflavors": repr(sorted((self.subflavors or {}).items()))}

    def __call__(self, record: dict, decoder=None):
        index = int(record[SRC][2])  # one file is one shard: the sample index is the line's
        name = self.path.rsplit("/", 1)[-1]
        return CrudeSample(__key__=str(index), __shard__=name, __restore_key__=("Webdataset", index),
                           __subflavors__=self.subflavors,
                           __sources__=(SourceInfo(dataset_path=self.path, index=index, shard_name=name,
                                                   file_names=(f"{index}.json",)),),
                           json={k: v for k, v in record.items() if k != SRC})


class EncodeSamples(Operator):
    """Stateless operator: reader records -> ``{"sample": encoded, "__src__", "__piece__"}``.

    ``factories``: one ``SampleFactory`` per dataset id. ``task_encoder``: cookers for crude samples,
    then ``encode_sample`` / ``preencode_sample`` and, when ``postencode`` is set (no packing),
    ``postencode_sample``. A skipped sample (``SkipSample``, or an error Energon's
    ``global_error_handler`` swallowed) becomes a ``SKIP`` marker that the next operator (a Filter)
    drops and counts."""

    name = "energon_encode"

    def __init__(self, factories, task_encoder, *, postencode: bool, seed_offset: int, error_handler=None):
        self.factories = list(factories)
        self.te = task_encoder
        self.seed_offset = seed_offset
        self.error_handler = error_handler
        te = task_encoder
        if overridden(te, "preencode_sample"):
            if overridden(te, "encode_sample"):
                raise ValueError("the TaskEncoder defines both encode_sample and preencode_sample (Energon refuses "
                                 "this too)")
            self.encode = te.preencode_sample
        elif overridden(te, "encode_sample"):
            self.encode = te.encode_sample
        else:
            self.encode = None
        self.postencode = te.postencode_sample if postencode and overridden(te, "postencode_sample") else None
        self.decoder = getattr(te, "decoder", None)
        self.cookers = list(getattr(te, "cookers", ()) or ())
        for c in self.cookers:
            if c.need_primary or c.need_cache:
                need = "a primary aux store" if c.need_primary else "a cache pool"
                raise ValueError(f"cooker {fn_name(c.cook)} needs {need}: auxiliary data and cache pools are not "
                                 f"supported by zephon_energon")

    def fingerprint(self) -> dict:
        decoder = getattr(self.te, "decoder", None)
        return {"op": self.name, "task_encoder": qualname(self.te),
                "encode": fn_name(self.encode) if self.encode else None,
                "postencode": fn_name(self.postencode) if self.postencode else None,
                "cookers": [fn_name(c.cook) for c in self.cookers],
                "decoder": repr(decoder.config()) if decoder else None,
                "datasets": [f.fingerprint() for f in self.factories]}

    def _cook(self, sample, record):
        for c in self.cookers:
            if c.is_match(sample["__subflavors__"] or {}):
                return call_hook(lambda s: c.cook(s), sample, record, self.error_handler, f"cooker {fn_name(c.cook)}")
        raise RecordError(f"no cooker of {qualname(self.te)} matches subflavors {sample['__subflavors__']!r} "
                          f"of crude sample {sample['__key__']!r}", record)

    def process_many(self, records: list[dict]) -> list[dict]:
        out = []
        for r in records:
            src = r["__src__"]
            with energon_context(self.seed_offset, src[3]):
                sample = self.factories[src[0]](r, self.decoder)
                if isinstance(sample, CrudeSample) and self.cookers:
                    sample = self._cook(sample, r)
                items = [sample] if sample is not None else []
                if self.encode is not None and items:
                    items = expand_result(call_hook(self.encode, sample, r, self.error_handler, "encode_sample"),
                                    r, self.error_handler, "encode_sample")
                if self.postencode is not None:
                    items = [x for x in (call_hook(self.postencode, it, r, self.error_handler, "postencode_sample")
                                         for it in items) if x is not None]
            if not items:
                out.append({SKIP: True, "__src__": src})
            for k, it in enumerate(items):
                rec = {"sample": it, "__src__": src}
                if k:
                    rec["__piece__"] = k
                out.append(rec)
        return out

