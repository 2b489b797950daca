"""Checkpoint state schema: plain JSON data, a typed lane cursor, validation against a config fingerprint.

A checkpoint holds, per lane, where replay starts (the chunk and offset of the last flush sentinel
before the cursor), how many rows of that span were already delivered (the replay cursor), the lane's
delivered row count and, when packing carried open bins across that sentinel, the carried documents by
stream position (``carry``, a few dozen integers). Pointer lists and chunk contents are never stored:
chunks are regenerated from ``(lane, chunk_id)``, so the size is a few hundred bytes per lane at most,
whatever the chunk size or step.
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass

from .config_diff import config_diff

FORMAT = "zephon-checkpoint/1"
SKIPS_KEY = "skips"  # the config key of the skipped step ranges (``checkpoint.skips``)
LANE_KEYS = ("lane", "sentinel_chunk", "sentinel_offset", "replay_cursor", "delivered_rows")
#: Optional lane entry key: ``{chain index (str): [[ref, ...] per open bin]}``, a ref being a stream
#: position (int), ``[position, piece]`` or ``[position, piece, token offset]`` (a document concat packing cut
#: mid-way): what an accumulator carried into the span (``engine.lane``).
CARRY_KEY = "carry"
#: Optional lane entry key: stream rows left out by skipped steps (``LaneCursor.skipped_rows``), when any.
SKIPPED_KEY = "skipped_rows"
OPTIONAL_KEYS = (CARRY_KEY, SKIPPED_KEY)
MAX_CARRIED = 1 << 16  # refs per lane entry: far above any Pack(max_carry); a bound against garbage
#: Version of the algorithms that turn a config into streams (index permutation, mixture allocation,
#: chunking, shuffle hash, packing; pinned by tests/test_golden.py). It is part of every config and so of
#: the fingerprint: bump it when a pinned output changes, and a checkpoint of the old algorithms is
#: refused by name instead of being restored onto a different stream.
ALGORITHM_VERSION = 4  # 4: a packed finite pass's size split plans whole rows per lane (tokens fitted to bytes);
#                        3: a finite pass's last rounds split over lanes by sample size (work.balance);
#                        2: finite passes split evenly over lanes, packing carries open bins across sentinels,
#                        permutations of up to 64 elements by a Fisher-Yates table


class CheckpointError(ValueError):
    """A checkpoint that cannot be applied: another config, missing lanes, or malformed."""


def check_given(state, where: str, *, none_ok: bool = False, also: tuple = ()) -> None:
    """Refuse, before it is parsed, what a restore entry point cannot take: anything but a checkpoint dict (or a
    list of them, or one of ``also``), naming what it got and what it expects.

    state: what the caller was given. where: the entry point, for the message (``"Loader.restore"``).
    none_ok: None is the entry point's documented fresh start (else it is refused: a fresh start never restores).
    also: further accepted types, which also allow a list or tuple of dicts (a host's ``SavedRanks``).
    Raises ``CheckpointError``."""
    if isinstance(state, dict) or (state is None and none_ok) or (also and isinstance(state, also)):
        return
    if also and isinstance(state, (list, tuple)) and all(isinstance(s, dict) for s in state):
        return
    if state is None:
        raise CheckpointError(f"{where} got None; it expects a Zephon checkpoint dict (for a fresh start do not "
                              f"restore at all)")
    hint = {bytes: "json.loads the bytes", str: "json.load the file (or json.loads the text)"}.get(type(state), "")
    raise CheckpointError(f"{where} got a {type(state).__name__}; it expects a JSON dict (a Zephon checkpoint: "
                          f"json.load the file){': ' + hint if hint else ''}")


@dataclass(frozen=True)
class LaneCursor:
    """One lane's position in a checkpoint: where its replay starts and how far delivery got.

    lane: lane id in ``[0, canonical_replicas)``.
    sentinel_chunk, sentinel_offset: the flush sentinel that opens the span being delivered (a lane-local
        pointer position ``sentinel_chunk * chunk_size + sentinel_offset``, a multiple of the flush span).
    replay_cursor: rows of that span already delivered (a resume regenerates the span and skips them).
    delivered_rows: rows of the lane delivered since the start of the run.
    carry: what accumulators carried into that span (see ``CARRY_KEY``), or None.
    skipped_rows: stream rows of the lane left out by skipped steps (``checkpoint.skips``) before its last
        delivered row; the lane's next stream row is ``delivered_rows + skipped_rows`` (``stream_rows``).
    JSON form: a dict with these keys, ``carry`` and ``skipped_rows`` only when set (``to_dict`` / ``from_dict``)."""

    lane: int
    sentinel_chunk: int = 0
    sentinel_offset: int = 0
    replay_cursor: int = 0
    delivered_rows: int = 0
    carry: dict | None = None
    skipped_rows: int = 0

    @classmethod
    def fresh(cls, lane: int) -> "LaneCursor":
        """The cursor of a lane that has delivered nothing."""
        return cls(lane)

    @classmethod
    def at_span(cls, lane: int, span_index: int, replay_cursor: int, delivered_rows: int, *, span: int,
                chunk_size: int, carry: dict | None = None, skipped_rows: int = 0) -> "LaneCursor":
        """The cursor of ``lane`` inside its flush span number ``span_index``.

        replay_cursor: rows of that span delivered; delivered_rows: rows of the lane delivered in all;
        span: pointers per flush span; chunk_size: pointers per chunk; carry: see ``CARRY_KEY`` (None or empty:
        nothing carried); skipped_rows: see the class."""
        chunk, offset = divmod(span_index * span, chunk_size)
        return cls(lane, chunk, offset, replay_cursor, delivered_rows, carry or None, skipped_rows)

    @classmethod
    def from_dict(cls, entry) -> "LaneCursor":
        """Parse a checkpoint lane entry. Raises ``CheckpointError`` naming the entry when keys or values
        are wrong (non-negative integers; ``replay_cursor <= delivered_rows``)."""
        if not isinstance(entry, dict) or sorted(k for k in entry if k not in OPTIONAL_KEYS) != sorted(LANE_KEYS):
            raise CheckpointError(f"malformed lane entry {entry!r}; expected keys {LANE_KEYS} (and optionally "
                                  f"{', '.join(map(repr, OPTIONAL_KEYS))})")
        ints = LANE_KEYS + ((SKIPPED_KEY,) if SKIPPED_KEY in entry else ())
        if not all(type(entry[k]) is int and 0 <= entry[k] < 1 << 62 for k in ints):
            raise CheckpointError(f"lane entry {entry!r}: values must be non-negative integers")
        if entry["replay_cursor"] > entry["delivered_rows"] + entry.get(SKIPPED_KEY, 0):
            raise CheckpointError(f"lane entry {entry!r}: replay_cursor exceeds delivered_rows")
        if CARRY_KEY in entry:
            _check_carry(entry)
        return cls(**{k: entry[k] for k in LANE_KEYS}, carry=entry.get(CARRY_KEY),
                   skipped_rows=entry.get(SKIPPED_KEY, 0))

    def to_dict(self) -> dict:
        """The checkpoint lane entry (keys in ``LANE_KEYS`` order, ``carry`` only when set; ``carry`` is
        this cursor's own dict, not a copy: treat both as read-only)."""
        d = {"lane": self.lane, "sentinel_chunk": self.sentinel_chunk, "sentinel_offset": self.sentinel_offset,
             "replay_cursor": self.replay_cursor, "delivered_rows": self.delivered_rows}
        if self.carry is not None:
            d[CARRY_KEY] = self.carry
        if self.skipped_rows:
            d[SKIPPED_KEY] = self.skipped_rows
        return d

    @property
    def stream_rows(self) -> int:
        """The lane's next row in the uninterrupted stream: rows delivered plus rows skipped."""
        return self.delivered_rows + self.skipped_rows

    def step(self, rows_per_lane_step: int) -> int:
        """The step the lane's next row belongs to (``rows_per_lane_step``: rows a lane gives per step)."""
        return self.delivered_rows // rows_per_lane_step

    def in_step(self, rows_per_lane_step: int) -> int:
        """Rows of the current step (``step``) already delivered: 0 at a step boundary."""
        return self.delivered_rows % rows_per_lane_step

    def position(self, rows_per_lane_step: int, micro_batch_size: int) -> tuple[int, int]:
        """``(step, micro-batch index)`` of the lane's next row (``micro_batch_size``: rows per micro-batch)."""
        return self.step(rows_per_lane_step), self.in_step(rows_per_lane_step) // micro_batch_size

    def first_pointer(self, chunk_size: int) -> int:
        """The lane-local pointer index of the sentinel that opens the span in progress (``chunk_size``:
        pointers per chunk)."""
        return self.sentinel_chunk * chunk_size + self.sentinel_offset


def first_step(cursors, rows_per_lane_step: int) -> int:
    """The earliest step any of ``cursors`` (``LaneCursor``s) still owes (0 for none): a checkpoint's ``step``."""
    return min((c.step(rows_per_lane_step) for c in cursors), default=0)


def _is_ref(r) -> bool:
    if type(r) is int:
        return 0 <= r < 1 << 62
    if not (isinstance(r, list) and r and all(type(x) is int for x in r) and 0 <= r[0] < 1 << 62):
        return False
    if len(r) == 2:  # [position, piece]
        return 0 < r[1] < 1 << 31
    return len(r) == 3 and 0 <= r[1] < 1 << 31 and 0 < r[2] < 1 << 31  # [position, piece, token offset]


def _check_carry(entry: dict) -> None:
    carry, n = entry[CARRY_KEY], 0
    ok = isinstance(carry, dict) and carry and all(isinstance(k, str) and k.isdigit() for k in carry)
    for bins in carry.values() if ok else ():
        ok = ok and isinstance(bins, list) and all(isinstance(b, list) and b and all(_is_ref(r) for r in b)
                                                   for b in bins)
        n += sum(len(b) for b in bins) if ok else 0
    if not ok or n > MAX_CARRIED:
        raise CheckpointError(f"lane {entry.get('lane')}: malformed {CARRY_KEY!r} {str(carry)[:200]}; expected "
                              f"{{chain index: [[position, [position, piece] or [position, piece, offset], ...] per "
                              f"open bin]}}")


def canonical_json(obj) -> str:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"))


def digest(obj) -> str:
    return hashlib.sha256(canonical_json(obj).encode()).hexdigest()


def _without_schedule(config):
    """``config`` with ``work.schedule`` left out: a mixture schedule is compared up to the checkpoint's
    position by the loader (``WorkSource.check_resume``), so a run can append a phase and resume."""
    if not isinstance(config, dict) or not isinstance(config.get("work"), dict) or "schedule" not in config["work"]:
        return config
    return {**config, "work": {k: v for k, v in config["work"].items() if k != "schedule"}}


def _without_skips(config):
    """``config`` without its skipped step ranges (``skips.SKIPS_KEY``): a resume adds them, so a checkpoint's are
    compared by the loader (``LoaderPlan.with_restored_skips``), not by the fingerprint."""
    if not isinstance(config, dict) or SKIPS_KEY not in config:
        return config
    return {k: v for k, v in config.items() if k != SKIPS_KEY}


def config_digest(config: dict) -> str:
    """The config fingerprint: ``digest`` of the config without its mixture schedule (see ``_without_schedule``)
    and skipped steps (``_without_skips``)."""
    return digest(_without_skips(_without_schedule(config)))


def summarize_config(config: dict) -> dict:
    """A compact view of the config for "what differs" messages: dataset fingerprints (which list
    every shard) are replaced by name, shard count, sample count and a digest."""
    out = dict(config)
    work = dict(out.get("work", {}))
    if "datasets" in work:
        work["datasets"] = [_dataset_summary(d) for d in work["datasets"]]
    out["work"] = work
    return out


def _dataset_summary(fp):
    if not isinstance(fp, dict):
        return fp
    shards = fp.get("shards", [])
    return {"name": fp.get("name"), "num_shards": len(shards),
            "num_samples": sum(s[1] for s in shards if isinstance(s, (list, tuple)) and len(s) > 1),
            "columns": fp.get("columns"), "digest": digest(fp)[:16]}


def validate(state, fingerprint: str, summary: dict, lanes=None, resume_check=None) -> dict:
    """Check ``state`` (a checkpoint dict) against this loader's config and, if ``lanes`` is given,
    that each of them is present. ``resume_check(state)``, when given, decides on a config whose mixture
    schedule differs (raising ``ValueError`` to refuse); without it the schedules must be equal. Returns
    ``{lane: LaneCursor}``. Raises ``CheckpointError`` that says what differs or which lanes are missing."""
    if not isinstance(state, dict) or state.get("format") != FORMAT:
        fmt = state.get("format") if isinstance(state, dict) else type(state).__name__
        raise CheckpointError(f"not a Zephon checkpoint (format {fmt!r}, expected {FORMAT!r})")
    _check_fields(state)
    if state.get("fingerprint") != fingerprint:
        ours, theirs = summary.get("algorithm"), (state.get("config") or {}).get("algorithm")
        if ours != theirs:
            raise CheckpointError(f"checkpoint was made by Zephon algorithm version {theirs} (index permutation, "
                                  f"mixture, chunking, shuffle, packing); this loader runs version {ours}, which "
                                  f"would regenerate different streams: resume with the Zephon that wrote it")
        diffs = config_diff(summary, state.get("config", {}))
        detail = "; ".join(diffs) if diffs else "fingerprints differ (dataset content or operator settings)"
        raise CheckpointError(f"checkpoint was made with another config: {detail}")
    lanes_list = state["lanes"]
    if state["lanes_sha256"] != digest(lanes_list):
        raise CheckpointError("checkpoint lane entries were altered or truncated (lanes_sha256 does not match)")
    by_lane = {}
    for entry in lanes_list:  # before the derived fields: a duplicated lane is named as such, not as a wrong step
        cursor = LaneCursor.from_dict(entry)
        if cursor.lane in by_lane:  # merged states hold each lane once: a second copy is an edit
            same = "the same state" if by_lane[cursor.lane] == cursor else "different states"
            raise CheckpointError(f"lane {cursor.lane} appears twice (with {same}): each lane must appear once")
        by_lane[cursor.lane] = cursor
    _check_derived(state, summary, lanes_list, schedule_checked=resume_check is not None)
    if resume_check is not None:
        try:
            resume_check(state)
        except ValueError as e:
            raise CheckpointError(f"checkpoint was made with another mixture schedule: {e}") from None
    if lanes is not None:
        missing = sorted(set(lanes) - set(by_lane))
        if missing:
            raise CheckpointError(f"checkpoint lacks lanes {missing} (it has {len(by_lane)} lanes: "
                                  f"{lane_ranges(sorted(by_lane))}); merge every rank's state before restoring")
    return by_lane


# The fields every checkpoint has (make_state), with their types: checked before their values are compared.
_FIELDS = {"fingerprint": str, "config": dict, "lanes": list, "lanes_sha256": str}
#: Every top-level key a checkpoint may hold: ``make_state``'s, a rank checkpoint's topology
#: (``host.rank_checkpoint``) and zephon_energon's epoch offsets (a rank's, or merged per lane).
_KEYS = set(_FIELDS) | {"format", "canonical_replicas", "rows_per_lane_step", "step", "saved_at", "epoch_offset",
                        "epoch_offsets"}


def _check_fields(state: dict) -> None:
    """Raise ``CheckpointError`` naming the fields of ``_FIELDS`` that ``state`` lacks or holds with another type
    (a truncated, hand-made or otherwise damaged checkpoint), before any of them is interpreted."""
    missing = [k for k in _FIELDS if k not in state]
    wrong = [f"{k!r} is {type(state[k]).__name__}, expected {t.__name__}" for k, t in _FIELDS.items()
             if k in state and not isinstance(state[k], t)]
    unknown = sorted(k for k in state if k not in _KEYS)
    wrong += [f"unknown field {k!r} (a checkpoint holds {', '.join(sorted(_KEYS))})" for k in unknown]
    if missing or wrong:
        what = "; ".join(([f"missing field(s) {', '.join(map(repr, missing))}"] if missing else []) + wrong)
        raise CheckpointError(f"damaged checkpoint: {what}. Save states with loader.checkpoint() (or merge_states) "
                              f"and store them whole, as JSON")


def _check_derived(state: dict, summary: dict, lanes_list: list, schedule_checked: bool = False) -> None:
    """The fields outside the lane entries repeat what the config and the lanes say: an edited copy is
    refused instead of being read by whoever trusts, say, ``step``. ``schedule_checked``: the mixture
    schedule is left to the caller's ``resume_check``."""
    summary = json.loads(canonical_json(summary))  # as it reads back from JSON (tuples become lists)
    strip = (lambda c: _without_skips(_without_schedule(c))) if schedule_checked else _without_skips
    if strip(state.get("config")) != strip(summary):
        diffs = config_diff(summary, state.get("config", {}))
        raise CheckpointError("checkpoint config summary was edited (the fingerprint matches this loader, the "
                              "summary does not): " + ("; ".join(diffs) or "structure differs"))
    r = (summary.get("work") or {}).get("canonical_replicas")
    gbs = summary.get("global_batch_size")
    expected = {"canonical_replicas": r}
    if isinstance(r, int) and isinstance(gbs, int) and r > 0:
        rps = gbs // r
        expected["rows_per_lane_step"] = rps
        if all(isinstance(e, dict) and type(e.get("delivered_rows")) is int for e in lanes_list):
            expected["step"] = first_step([LaneCursor(e.get("lane"), delivered_rows=e["delivered_rows"])
                                           for e in lanes_list], rps)
    for key, value in expected.items():
        if value is not None and state.get(key) != value:
            raise CheckpointError(f"checkpoint field {key!r} is {state.get(key)!r} but its config and lane entries "
                                  f"say {value!r}: the file was edited or truncated")


def initial_lanes(lanes) -> list[LaneCursor]:
    """Cursors of lanes that have delivered nothing (a fresh start), in the given order."""
    return [LaneCursor.fresh(lane) for lane in lanes]


def make_state(fingerprint: str, summary: dict, canonical_replicas: int, rows_per_lane_step: int, lanes) -> dict:
    """Assemble a checkpoint dict: the one place a state is written.

    fingerprint, summary: the config's (``config_digest``, ``summarize_config``); canonical_replicas: lanes;
    rows_per_lane_step: rows a lane gives per step; lanes: ``LaneCursor``s or lane entries (parsed here), any
    order (written sorted by lane, each as ``LaneCursor.to_dict``). Raises ``CheckpointError`` for a malformed
    entry."""
    cursors = sorted((c if isinstance(c, LaneCursor) else LaneCursor.from_dict(c) for c in lanes),
                     key=lambda c: c.lane)
    entries = [c.to_dict() for c in cursors]
    return {"format": FORMAT, "fingerprint": fingerprint, "config": summary,
            "canonical_replicas": canonical_replicas, "rows_per_lane_step": rows_per_lane_step,
            "step": first_step(cursors, rows_per_lane_step), "lanes": entries, "lanes_sha256": digest(entries)}


def lane_ranges(xs) -> str:
    """``[0, 1, 2, 5]`` -> ``"0-2, 5"`` (for messages)."""
    out, i = [], 0
    while i < len(xs):
        j = i
        while j + 1 < len(xs) and xs[j + 1] == xs[j] + 1:
            j += 1
        out.append(str(xs[i]) if i == j else f"{xs[i]}-{xs[j]}")
        i = j + 1
    return ", ".join(out) or "none"
