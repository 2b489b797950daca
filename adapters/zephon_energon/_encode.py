"""Energon samples and TaskEncoder hooks as Zephon operators.

Worker side (stateless, any worker, any order): ``EncodeSamples`` turns a reader record of an
Energon-prepared dataset (``{"__key__", "__restore_key__", "__shard__", "__parts__"}``) into the
dataset's Energon sample (``TextSample``, ``CaptioningSample``, ... from ``field_map``; a
``CrudeSample`` cooked by the task encoder's cookers), then runs ``encode_sample`` (or
``preencode_sample``; ``postencode_sample`` too when there is no packing).

Pump side (one accumulator per lane, in order): ``TaskPack`` wraps ``select_samples_to_pack`` /
``pack_selected_samples`` (and ``postencode_sample``) with Energon's packing-buffer semantics; a
flush sentinel packs what the buffer holds, as Energon does at the end of its stream.

Every hook runs with an Energon worker context whose sample index is the element's global stream
position (a pure function of the config), so ``@stateless(restore_seeds=True)`` hooks and
``current_sample_index`` give the same values whatever the world size, worker count or resume point.
"""
from __future__ import annotations

import dataclasses
import importlib
import inspect
from contextlib import contextmanager
from types import GeneratorType

from megatron.energon import CrudeSample, SkipSample, WorkerConfig
from megatron.energon.flavors.webdataset.field_access import field_access, split_field_access
from megatron.energon.epathlib import EPath
from megatron.energon.source_info import SourceInfo

from zephon.ops import Accumulator, Operator, RecordError

SKIP = "__energon_skip__"


def qualname(obj) -> str:
    t = obj if isinstance(obj, type) else type(obj)
    return f"{t.__module__}.{t.__qualname__}"


def fn_name(fn) -> str:
    fn = getattr(fn, "__func__", fn)
    return f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', repr(fn))}"


def overridden(task_encoder, name: str) -> bool:
    """Whether ``task_encoder`` overrides hook ``name`` of Energon's base classes (as Energon decides)."""
    from megatron.energon import DefaultTaskEncoder, TaskEncoder

    return task_encoder._is_overridden(getattr(task_encoder, name), bases=(TaskEncoder, DefaultTaskEncoder)) \
        if name == "encode_sample" else task_encoder._is_overridden(getattr(task_encoder, name))


# -- the Energon worker context ----------------------------------------------------------------
_CONTEXTS: dict[int, WorkerConfig] = {}


@contextmanager
def energon_context(seed_offset: int, index: int):
    """Activate an Energon worker context (so ``current_sample_index``, ``restore_seeds`` and
    ``WorkerConfig.active_worker_config`` work in user hooks) whose worker identity is fixed and whose
    sample index is ``index``: hook randomness then depends on the element, never on the topology."""
    cfg = _CONTEXTS.get(seed_offset)
    if cfg is None:
        cfg = _CONTEXTS[seed_offset] = WorkerConfig(rank=0, world_size=1, num_workers=1, seed_offset=seed_offset)
    outer = WorkerConfig.active_worker_config, WorkerConfig._sample_index_stack, \
        WorkerConfig._worker_override_global_rank
    WorkerConfig.active_worker_config = None
    # override_global_rank=1 (truthy): worker 1 % 1 == 0 of a 1-worker rank, in or out of a DataLoader worker.
    cfg.worker_activate(int(index), override_global_rank=1)
    try:
        yield
    finally:
        WorkerConfig.active_worker_config, WorkerConfig._sample_index_stack, \
            WorkerConfig._worker_override_global_rank = outer


def _identity(record) -> int:
    src = record["__src__"]
    if isinstance(src, list):
        return int(src[0][0]) if src else 0
    return int(src[3])


def _call(hook, arg, record, error_handler, what: str):
    """Run a user hook. ``SkipSample`` -> ``None`` (dropped, counted). Other exceptions go to Energon's
    ``global_error_handler``: if it returns, the element is dropped and counted; if it raises, the error
    names the file, shard and sample (``RecordError``)."""
    try:
        return hook(arg)
    except SkipSample:
        return None
    except Exception as e:  # user code sees bad data first: name the sample
        if error_handler is not None:
            try:
                error_handler(e, arg, _sources(arg))
                return None
            except Exception:
                pass
        raise RecordError(f"{what} failed: {type(e).__name__}: {e}", record) from e


def _sources(sample):
    try:
        from megatron.energon.source_info import get_source_info
        return get_source_info(sample)
    except Exception:
        return None


def _expand(result, record, handler, what):
    """A hook result as a list: a generator yields 0..n elements, ``None`` (skipped) gives none."""
    if result is None:
        return []
    if not isinstance(result, GeneratorType):
        return [result]
    out = []
    try:
        for item in result:
            out.append(item)
    except SkipSample:
        pass
    except Exception as e:
        if handler is not None:
            try:
                handler(e, record, None)
                return out
            except Exception:
                pass
        raise RecordError(f"{what} failed: {type(e).__name__}: {e}", record) from e
    return out


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


class SampleFactory:
    """Builds one dataset's Energon samples from reader records, as Energon's
    ``DefaultGenericWebdatasetFactory.load_sample`` does: ``field_map`` entries (``json[caption]``
    paths, ``jpg,png`` alternatives) through Energon's own ``field_access``; crude datasets give a
    ``CrudeSample`` of every part. ``__key__``, ``__restore_key__``, ``__subflavors__`` and
    ``__sources__`` are set as Energon sets them."""

    def __init__(self, path: str, meta: dict, subflavors: dict | None = None):
        self.path = str(path)
        self.crude = bool(meta.get("crude"))
        self.subflavors = dict(meta.get("subflavors") or {})
        self.subflavors.update(subflavors or {})
        self.sample_type = CrudeSample if self.crude else resolve_sample_type(meta.get("sample_type"))
        fm = meta.get("field_map")
        if not self.crude and not fm:
            raise ValueError(f"{self.path}: dataset.yaml has neither a field_map nor a crude sample type; "
                             f"sample_loader/part_filter Python hooks are not supported by zephon_energon")
        self.field_map = dict(fm or {})
        self._fields = {k: split_field_access(v) for k, v in self.field_map.items()}
        if not self.crude:
            names = {f.name for f in dataclasses.fields(self.sample_type)}
            extra = sorted(set(self._fields) - names)
            if extra:
                raise ValueError(f"{self.path}: field_map keys {extra} are not fields of "
                                 f"{self.sample_type.__name__}")

    def fingerprint(self) -> dict:
        return {"sample_type": qualname(self.sample_type), "field_map": self.field_map,
                "subflavors": repr(sorted(self.subflavors.items())), "crude": self.crude}

    def __call__(self, record: dict, decoder=None):
        parts = record["__parts__"]
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
        values = {}
        for name, access in self._fields.items():
            try:
                values[name] = field_access(parts, access)
            except Exception as e:
                raise RecordError(f"sample {key!r}: field_map {name}: {self.field_map[name]!r} cannot be read "
                                  f"({type(e).__name__}: {e}); parts present: {sorted(parts)}", record) from None
        return self.sample_type(__key__=key, __restore_key__=rk, __subflavors__=self.subflavors,
                                __sources__=src, **values)


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
                raise ValueError(f"cooker {fn_name(c.cook)} needs {'a primary aux store' if c.need_primary else 'a cache pool'}"
                                 f": auxiliary data and cache pools are not supported by zephon_energon")

    def fingerprint(self) -> dict:
        return {"op": self.name, "task_encoder": qualname(self.te),
                "encode": fn_name(self.encode) if self.encode else None,
                "postencode": fn_name(self.postencode) if self.postencode else None,
                "cookers": [fn_name(c.cook) for c in self.cookers],
                "decoder": repr(getattr(self.te, "decoder", None).config()) if getattr(self.te, "decoder", None) else None,
                "datasets": [f.fingerprint() for f in self.factories]}

    def _cook(self, sample, record):
        for c in self.cookers:
            if c.is_match(sample["__subflavors__"] or {}):
                return _call(lambda s: c.cook(s), sample, record, self.error_handler, f"cooker {fn_name(c.cook)}")
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
                    items = _expand(_call(self.encode, sample, r, self.error_handler, "encode_sample"),
                                    r, self.error_handler, "encode_sample")
                if self.postencode is not None:
                    items = [x for x in (_call(self.postencode, it, r, self.error_handler, "postencode_sample")
                                         for it in items) if x is not None]
            if not items:
                out.append({SKIP: True, "__src__": src})
            for k, it in enumerate(items):
                rec = {"sample": it, "__src__": src}
                if k:
                    rec["__piece__"] = k
                out.append(rec)
        return out


def keep(record) -> bool:
    """Filter function: drop the markers of skipped samples (the engine counts them as filtered)."""
    return SKIP not in record


class TaskPack(Operator):
    """Accumulator operator: the task encoder's packing with a buffer of ``buffer_size`` samples.

    As Energon's ``PackingDataset``: the reading buffer fills until reading + selected samples reach
    ``buffer_size``; then, if no selected packs remain, ``select_samples_to_pack(reading buffer)`` picks
    the packs (samples it leaves out are dropped); one pack is finished per arriving sample
    (``postencode_sample`` on each member, then ``pack_selected_samples``, possibly a generator). A
    flush (sentinel or end of lane) finishes every selected pack, selects from what is left and
    finishes those too. Decisions depend only on the lane's elements since the last flush."""

    name = "energon_pack"

    def __init__(self, task_encoder, buffer_size: int, *, seed_offset: int, error_handler=None):
        if not isinstance(buffer_size, int) or buffer_size < 1:
            raise ValueError(f"packing_buffer_size must be an int >= 1, got {buffer_size!r}")
        if not (overridden(task_encoder, "select_samples_to_pack") and overridden(task_encoder, "pack_selected_samples")):
            raise ValueError("packing_buffer_size needs a TaskEncoder that overrides both select_samples_to_pack "
                             "and pack_selected_samples (as Energon requires)")
        self.te, self.buffer_size = task_encoder, buffer_size
        self.seed_offset, self.error_handler = seed_offset, error_handler
        self.postencode = task_encoder.postencode_sample if overridden(task_encoder, "postencode_sample") else None

    def fingerprint(self) -> dict:
        return {"op": self.name, "buffer_size": self.buffer_size,
                "select": fn_name(self.te.select_samples_to_pack), "pack": fn_name(self.te.pack_selected_samples),
                "postencode": fn_name(self.postencode) if self.postencode else None}

    def new_accumulator(self, lane: int) -> "TaskPackAccumulator":
        return TaskPackAccumulator(self)


class TaskPackAccumulator(Accumulator):
    def __init__(self, op: TaskPack):
        self.op = op
        self.reading: list[dict] = []
        self.packs: list[list[dict]] = []
        self.selected = 0

    def push(self, record: dict) -> list[dict]:
        self.reading.append(record)
        out = []
        while len(self.reading) + self.selected >= self.op.buffer_size:
            if not self.packs:
                self._select()
                if not self.packs:
                    break  # nothing selected: the buffer was dropped, refill
            out.extend(self._finish())
        return out

    def flush(self) -> list[dict]:
        out = []
        while self.packs:
            out.extend(self._finish())
        if self.reading:
            self._select()
        while self.packs:
            out.extend(self._finish())
        self.reading, self.packs, self.selected = [], [], 0
        return out

    def _select(self) -> None:
        recs, self.reading = self.reading, []
        by_id = {id(r["sample"]): r for r in recs}
        with energon_context(self.op.seed_offset, _identity(recs[0])):
            groups = _call(self.op.te.select_samples_to_pack, [r["sample"] for r in recs], recs[0],
                           self.op.error_handler, "select_samples_to_pack") or []
        for g in groups:
            if len(g) == 0:
                continue
            try:
                members = [by_id[id(s)] for s in g]
            except KeyError:
                raise RecordError("select_samples_to_pack returned a sample that was not in the buffer "
                                  "(return the given sample objects, grouped)", recs[0]) from None
            self.packs.append(members)
            self.selected += len(members)

    def _finish(self) -> list[dict]:
        members = self.packs.pop(0)
        self.selected -= len(members)
        op = self.op
        with energon_context(op.seed_offset, _identity(members[0])):
            samples = [m["sample"] for m in members]
            if op.postencode is not None:
                samples = [_call(op.postencode, s, m, op.error_handler, "postencode_sample")
                           for s, m in zip(samples, members)]
                samples = [s for s in samples if s is not None]
                if not samples:
                    return []
            packed = _call(op.te.pack_selected_samples, samples, members[0], op.error_handler,
                           "pack_selected_samples")
            packed = _expand(packed, members[0], op.error_handler, "pack_selected_samples")
        src = [(int(m["__src__"][3]) if not isinstance(m["__src__"], list) else m["__src__"][0][0],
                m.get("__piece__", 0)) for m in members]
        return [{"sample": p, "__src__": list(src), **({"__piece__": k} if k else {})} for k, p in enumerate(packed)]


def is_generator_fn(fn) -> bool:
    return inspect.isgeneratorfunction(getattr(fn, "__func__", fn))
