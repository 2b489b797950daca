"""Exactly-once delivery under random interleavings of iterate / checkpoint / interrupt / restore, with the dp
degree, the runner and the worker count changing at every restore (a hypothesis state machine).

The oracle is independent of the code under test: the documents are read back from the JSONL file with ``json``
and cut into ``max_length`` pieces from ``tokenizers``' own token counts; at the end every (document, piece) must
have been delivered exactly once, counting what was delivered up to each restored checkpoint plus what came after.
An *interrupt* raises inside the loader (in a worker's operator, or while a micro-batch is collated: on the
builder thread with the threads and processes runners, inside ``next()`` with inline) and the test checkpoints in
the ``except`` handler, as a training script catching Ctrl-C would, then restores.

The default suite runs a few dozen examples; ``pytest -m slow tests/test_state_machine.py`` runs 1,000
(``ZEPHON_STATE_MACHINE_EXAMPLES`` overrides the number) and the processes runner too, with worker kills (SIGKILL of
a worker process, as the OOM killer does) among the steps: the runner replaces the worker and re-runs its units.
"""
from __future__ import annotations

import json
import math
import os
import signal

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (RuleBasedStateMachine, initialize, invariant, precondition, rule,
                                 run_state_machine_as_test)
from tokenizers import Tokenizer

from zephon.engine import Loader
from zephon.checkpoint import merge_states
from zephon.engine import tail as loader_module
from zephon.engine.runners import make_runner
from zephon.formats import DataError, open_dataset
from zephon.ops import Batch, Decode, Map, Pack, Shuffle, Tokenize

R, MAX_LEN, DOCS = 4, 48, 90
RUNNERS = ("inline", "threads", "processes")


class Interrupt(Exception):
    """What the test raises inside the loader (stands for a KeyboardInterrupt: both leave the generator)."""


_ARMED = {"worker": -1, "collate": -1}  # calls left before raising; -1: disarmed
_FIRED = {"worker": 0, "collate": 0}  # interrupts that really happened (the run must have some of each)
_COUNTS = {"examples": 0, "restores": 0, "micro_batches": 0, "kills": 0}


def _maybe_raise(where: str) -> None:
    if _ARMED[where] == 0:
        _ARMED[where] = -1
        _FIRED[where] += 1
        raise Interrupt(f"injected at {where}")
    if _ARMED[where] > 0:
        _ARMED[where] -= 1


def tag(record):
    """The worker-side injection point (a stateless Map operator; module level so processes could pickle it)."""
    _maybe_raise("worker")
    return record


@pytest.fixture(scope="module")
def small_corpus(tmp_path_factory, stdlib_texts, tokenizer_path):
    """One JSONL file of DOCS real documents, and each document's piece count computed with ``tokenizers``."""
    docs, code = stdlib_texts
    texts = (docs[:DOCS // 2] + code[:DOCS - DOCS // 2])[:DOCS]
    d = tmp_path_factory.mktemp("machine")
    with open(d / "docs.jsonl", "w", encoding="utf-8") as fh:
        for t in texts:
            fh.write(json.dumps({"text": t}) + "\n")
    tok = Tokenizer.from_file(tokenizer_path)
    pieces = [math.ceil((len(e.ids) + 1) / MAX_LEN)  # +1: the EOS token
              for e in tok.encode_batch(texts, add_special_tokens=False)]
    return str(d), pieces


@pytest.fixture(scope="module")
def small_corpus_tokens(small_corpus, tokenizer_path):
    """Each document's tokens (``tokenizers``' own ids, then the EOS id 1), by position in the pass."""
    corpus_dir, _ = small_corpus
    with open(f"{corpus_dir}/docs.jsonl", encoding="utf-8") as fh:
        texts = [json.loads(line)["text"] for line in fh]
    tok = Tokenizer.from_file(tokenizer_path)
    return [e.ids + [tok.token_to_id("<eos>")] for e in tok.encode_batch(texts, add_special_tokens=False)]


def _ops(tokenizer_path, method="best_fit"):
    """The pipeline; ``method``: a Pack method, or ``"concat_shift"`` (concat with ``shift_labels``)."""
    concat = method.startswith("concat")
    pack = Pack(MAX_LEN, method="concat", shift_labels=method == "concat_shift") if concat else Pack(MAX_LEN, method)
    return [Decode("text"), Map(tag), Tokenize(tokenizer_path, eos_id="<eos>", max_length=None if concat else MAX_LEN),
            pack, Shuffle(3, seed=1), Batch(1, drop_last=False)]


def row_segments(mb) -> list:
    """A concat micro-batch as ``("row", lane, tokens in the row)`` per row, then ``(position, piece, tokens)`` per
    document segment of it (from ``cu_seqlens``: a document cut across rows has a segment in each)."""
    out = []
    for i, srcs in enumerate(mb["__src__"]):
        ids, cu = mb["input_ids"][i], mb["cu_seqlens"][i]
        out.append(("row", mb["__lane__"], int(mb["attention_mask"][i].sum())))
        out.extend((int(pos), int(piece), tuple(int(t) for t in ids[cu[j]:cu[j + 1]]))
                   for j, (pos, piece) in enumerate(srcs))
    return out


def check_concat_exactly_once(delivered, expected_tokens, lanes: int) -> None:
    """Every token of every document once: per document, the delivered segments hold exactly the tokens of one input
    document (as a multiset: rows are shuffled after packing) and no row is short but the last of each lane."""
    rows = [d for d in delivered if d[0] == "row"]
    short = [d for d in rows if 0 < d[2] < MAX_LEN]
    assert len(short) <= lanes and len({lane for _, lane, _ in short}) == len(short), f"padded rows {short}"
    got = {}
    for pos, piece, toks in (d for d in delivered if d[0] != "row"):
        assert piece == 0
        got.setdefault(pos, []).extend(toks)
    assert sum(n for _, _, n in rows) == sum(map(len, expected_tokens)), "token count differs"
    lost = sorted(set(range(len(expected_tokens))) - set(got))
    assert not lost, f"{len(lost)} documents lost, e.g. positions {lost[:5]}"
    # a position is the sample's place in the shuffled pass, not its line: compare the documents as a multiset
    got_docs = sorted(tuple(sorted(toks)) for toks in got.values())
    assert got_docs == sorted(tuple(sorted(toks)) for toks in expected_tokens), \
        "documents delivered with other tokens (some lost or repeated)"


def check_exactly_once(delivered, expected_pieces) -> None:
    """Every sample of the pass, each piece of it once: ``delivered`` (position, piece) pairs against the piece
    counts computed from the input file (a sample's position is its place in the pass: its identity)."""
    assert len(delivered) == len(set(delivered)), "a (sample, piece) was delivered twice"
    pieces = {}
    for position, piece in delivered:
        pieces.setdefault(position, set()).add(piece)
    lost = sorted(set(range(len(expected_pieces))) - set(pieces))
    assert not lost, f"{len(lost)} samples lost, e.g. positions {lost[:5]}"
    assert sorted(pieces) == list(range(len(expected_pieces))), f"unknown positions {sorted(pieces)[-3:]}"
    torn = [p for p, got in pieces.items() if got != set(range(len(got)))]
    assert not torn, f"pieces of samples {torn[:5]} lost"
    assert sorted(len(p) for p in pieces.values()) == sorted(expected_pieces), "piece counts differ"


def build_loaders(corpus_dir, tokenizer_path, shared, dp, runner, workers, state, method="best_fit"):
    """Every rank's Loader of a finite, packed pass at ``dp``, restored from ``state`` (None: a fresh start)."""
    dataset = open_dataset(corpus_dir)
    loaders = []
    for r in range(dp):
        spec = runner
        if runner == "processes":  # one pool for the whole run: spawning per example would take minutes
            if "processes" not in shared:
                probe = Loader([dataset], _ops(tokenizer_path), canonical_replicas=R, runner="inline")
                shared["processes"] = make_runner("processes", probe.stage, 2)
                # killed workers are replaced; the give-up limit (deaths in a row) is another test's subject
                shared["processes"].max_restarts = 10 ** 6
            spec = shared["processes"]
        L = Loader([dataset], _ops(tokenizer_path, method), seed=3, canonical_replicas=R, chunk_size=8,
                   global_batch_size=2 * R, exhaustion="stop", flush_every_k_chunks=1, dp_degree=dp,
                   dp_rank=r, runner=spec, num_workers=workers, unit_size=4)
        if state is not None:
            L.restore(state)
        loaders.append(L)
    return loaders


class Machine(RuleBasedStateMachine):
    """The loaders of every rank of the current topology; ``delivered``: (position, piece) pairs received,
    position being the sample's place in the pass (its identity), piece the part of a long document."""

    corpus_dir = tokenizer_path = None  # set by _run on a subclass
    runners: tuple = ()
    shared: dict = {}
    pieces: list = []  # each sample's piece count, from the input file
    method = "best_fit"
    tokens: list = []  # concat: each sample's tokens, from the input file

    def _build(self, dp, runner, workers, state):
        self._close()
        if runner not in self.runners:  # the runners this run covers (processes only in the slow run)
            runner = "threads"
        _COUNTS["restores"] += state is not None
        self.loaders = build_loaders(self.corpus_dir, self.tokenizer_path, self.shared, dp, runner, workers, state,
                                     self.method)
        self.iters = [iter(L) for L in self.loaders]
        self.ended = [False] * dp
        self.topology = (dp, runner, workers)

    def _close(self):
        for L in getattr(self, "loaders", []):
            L.close()
        self.loaders = []

    def _record(self, mb):
        _COUNTS["micro_batches"] += 1
        if self.method.startswith("concat"):
            self.delivered.extend(row_segments(mb))
            return
        for srcs in mb["__src__"]:
            self.delivered.extend(tuple(s) for s in srcs)

    def _next(self, rank):
        """``next()`` of rank ``rank``'s iterator. An interrupt armed by an earlier rule may surface only now: the
        workers work ahead of the consumer (engine.dispatch) and each rank's builder thread collates ahead of it
        (engine.builder), so the error reaches the loop when the loop reaches its sample or micro-batch, possibly
        after the rule that armed it ended, possibly in another rank's loader. Handled as the interrupt rule does
        (checkpoint, rebuild on the same topology), then the pull goes on."""
        while True:
            try:
                return next(self.iters[rank])
            except (DataError, Interrupt) as e:
                if isinstance(e, DataError) and "injected at worker" not in str(e):
                    raise
                self._build(*self.topology, self._checkpoint())

    def _checkpoint(self):
        state = merge_states([L.checkpoint() for L in self.loaders])
        return json.loads(json.dumps(state))  # a checkpoint is plain JSON data

    @initialize(dp=st.sampled_from([1, 2, 4]), runner=st.sampled_from(RUNNERS), workers=st.integers(1, 3))
    def start(self, dp, runner, workers):
        _ARMED.update(worker=-1, collate=-1)
        _COUNTS["examples"] += 1
        self.delivered = []
        self.saved = None  # (checkpoint, what had been delivered when it was taken)
        self._build(dp, runner, workers, None)

    @rule(rank=st.integers(0, 3), n=st.integers(1, 12))
    def pull(self, rank, n):
        rank %= len(self.loaders)
        for _ in range(n):
            if self.ended[rank]:
                return
            try:
                self._record(self._next(rank))
            except StopIteration:
                self.ended[rank] = True

    @rule(which=st.integers(0, 1), rank=st.integers(0, 3), n=st.integers(1, 8))
    def kill_worker(self, which, rank, n):
        """SIGKILL a worker of the processes runner (the OOM killer's way), then keep pulling: its units re-run on a
        replacement, and nothing is lost or repeated."""
        if self.topology[1] != "processes":
            return
        pids = self.shared["processes"].pids
        if not pids:
            return
        try:
            os.kill(pids[which % len(pids)], signal.SIGKILL)
        except ProcessLookupError:
            return
        _COUNTS["kills"] += 1
        self.pull(rank, n)

    @rule()
    def checkpoint(self):
        self.saved = (self._checkpoint(), list(self.delivered))

    @rule(rank=st.integers(0, 3), where=st.sampled_from(["worker", "collate"]), after=st.integers(0, 6),
          dp=st.sampled_from([1, 2, 4]), runner=st.sampled_from(RUNNERS), workers=st.integers(1, 3))
    def interrupt(self, rank, where, after, dp, runner, workers):
        """Raise inside the loader, checkpoint in the handler, restore on a (maybe) new topology."""
        rank %= len(self.loaders)
        if self.ended[rank] or (where == "worker" and self.topology[1] == "processes"):
            return  # the flag does not reach a spawned worker
        _ARMED[where] = after
        try:
            for _ in range(40):
                self._record(next(self.iters[rank]))
        except (Interrupt, DataError):  # a worker's error reaches the loop as a DataError naming the sample
            state = self._checkpoint()  # what a script's `except KeyboardInterrupt:` would save
            self._build(dp, runner, workers, state)
        except StopIteration:
            self.ended[rank] = True
        finally:
            _ARMED.update(worker=-1, collate=-1)

    @precondition(lambda self: self.saved is not None)
    @rule(dp=st.sampled_from([1, 2, 4]), runner=st.sampled_from(RUNNERS), workers=st.integers(1, 3))
    def restore(self, dp, runner, workers):
        state, delivered = self.saved
        self.delivered = list(delivered)
        self._build(dp, runner, workers, state)

    @invariant()
    def never_twice(self):
        if self.method.startswith("concat"):  # a segment may repeat legitimately (same text): teardown counts tokens
            return
        assert len(self.delivered) == len(set(self.delivered)), "a (document, piece) was delivered twice"

    def teardown(self):
        try:
            if getattr(self, "loaders", None):
                for rank in range(len(self.iters)):
                    while not self.ended[rank]:
                        try:
                            self._record(self._next(rank))
                        except StopIteration:
                            self.ended[rank] = True
                if self.method.startswith("concat"):
                    check_concat_exactly_once(self.delivered, self.tokens, R)
                else:
                    check_exactly_once(self.delivered, self.pieces)
        finally:
            self._close()


def _run(small_corpus, tokenizer_path, runners, examples, steps, method="best_fit", tokens=()):
    corpus_dir, pieces = small_corpus
    shared = {}
    _FIRED.update(worker=0, collate=0)
    _COUNTS.update(examples=0, restores=0, micro_batches=0, kills=0)
    machine = type("Run", (Machine,), {"corpus_dir": corpus_dir, "tokenizer_path": tokenizer_path,
                                       "runners": tuple(runners), "shared": shared, "pieces": pieces,
                                       "method": method, "tokens": list(tokens)})
    deaths = []
    try:
        run_state_machine_as_test(machine, settings=settings(
            max_examples=examples, stateful_step_count=steps, deadline=None, database=None, derandomize=True,
            suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much]))
    finally:
        if "processes" in shared:
            deaths = list(shared["processes"].deaths)
            shared["processes"].close()
    print(f"state machine: {_COUNTS['examples']} examples, {_COUNTS['restores']} restores, "
          f"{_COUNTS['micro_batches']} micro-batches, interrupts {_FIRED}, {_COUNTS['kills']} worker kills "
          f"({len(deaths)} deaths seen by the runner)")
    assert _COUNTS["examples"] >= examples, f"hypothesis ran {_COUNTS['examples']} of {examples} examples"
    assert _FIRED["worker"] and _FIRED["collate"], f"the run injected too few interrupts: {_FIRED}"
    if "processes" in runners:
        assert _COUNTS["kills"] and deaths, f"the run killed {_COUNTS['kills']} workers, the runner saw {deaths}"
        assert all(rc == -signal.SIGKILL for _, rc, _ in deaths), f"workers died otherwise: {deaths}"


@pytest.fixture(autouse=True)
def _collate_hook(monkeypatch):
    real = loader_module.collate

    def collate(rows):
        _maybe_raise("collate")
        return real(rows)

    monkeypatch.setattr(loader_module, "collate", collate)


def test_exactly_once_under_interrupts_restores_and_topology_changes(small_corpus, tokenizer_path):
    _run(small_corpus, tokenizer_path, ["inline", "threads"], examples=30, steps=12)


@pytest.mark.parametrize("method", ["concat", "concat_shift"])
def test_concat_exactly_once_by_tokens_under_interrupts_restores_and_topology_changes(
        small_corpus, small_corpus_tokens, tokenizer_path, method):
    """Pack(method="concat") (and its max_length + 1 windows): every input token of every document once, whatever
    the cuts, dp degrees and runners."""
    _run(small_corpus, tokenizer_path, ["inline", "threads"], examples=8, steps=12, method=method,
         tokens=small_corpus_tokens)


@pytest.mark.slow
def test_exactly_once_state_machine_thousand_examples(small_corpus, tokenizer_path):
    examples = int(os.environ.get("ZEPHON_STATE_MACHINE_EXAMPLES", "1000"))
    _run(small_corpus, tokenizer_path, ["inline", "threads", "processes"], examples=examples, steps=15)
