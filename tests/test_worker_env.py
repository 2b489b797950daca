"""The ``processes`` runner's workers get the tokenizer's thread pool settings (parallelism on, ``ceil(2 * cores /
workers)`` threads, so a worker alone with work still uses every core), unless the parent's environment says
otherwise; read back from inside real worker processes."""
from __future__ import annotations

import json
import os

import pytest

from zephon.engine import Loader
from zephon.engine.runners import ProcessRunner
from zephon.engine.runners.spawn import tokenizer_threads_env
from zephon.formats import open_dataset
from zephon.ops import Batch, Decode, Map


def with_env(r):
    """Tag a record with the worker's tokenizer settings (module level: the worker imports it)."""
    env = os.environ
    return {"text": r["text"], "env": f"{env.get('TOKENIZERS_PARALLELISM')}/{env.get('RAYON_NUM_THREADS')}"}


def cores() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()


@pytest.fixture(scope="module")
def jsonl(tmp_path_factory):
    d = tmp_path_factory.mktemp("env_data")
    with open(d / "docs.jsonl", "w") as f:
        for i in range(16):
            f.write(json.dumps({"text": f"doc {i}"}) + "\n")
    return d


def make(jsonl, runner):
    return Loader([open_dataset(jsonl)], [Decode("text"), Map(with_env, name="env"), Batch(4)], runner=runner,
                  canonical_replicas=2, chunk_size=8, unit_size=4, exhaustion="stop", seed=1)


def worker_envs(jsonl, workers: int) -> set:
    """The settings every delivered record saw in its worker."""
    runner = ProcessRunner(make(jsonl, "inline").stage, workers)
    try:
        with make(jsonl, runner) as L:
            return {e for mb in L for e in mb["env"]}
    finally:
        runner.close()


def test_workers_get_the_thread_pool_settings(jsonl, monkeypatch):
    monkeypatch.delenv("TOKENIZERS_PARALLELISM", raising=False)
    monkeypatch.delenv("RAYON_NUM_THREADS", raising=False)
    c = cores()
    assert worker_envs(jsonl, 1) == {f"true/{c}"}  # one worker: the whole machine
    assert worker_envs(jsonl, 2 * c) == {"true/1"}  # more workers than cores: one thread each


def test_the_parents_settings_win(jsonl, monkeypatch):
    monkeypatch.setenv("TOKENIZERS_PARALLELISM", "false")
    monkeypatch.setenv("RAYON_NUM_THREADS", "3")
    assert worker_envs(jsonl, 1) == {"false/3"}


@pytest.mark.parametrize("workers, expect", [(1, 8), (2, 8), (3, 6), (4, 4), (5, 4), (16, 1), (64, 1)])
def test_threads_per_worker_on_eight_cores(monkeypatch, workers, expect):
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(8)), raising=False)
    assert tokenizer_threads_env(workers, {}) == {"TOKENIZERS_PARALLELISM": "true", "RAYON_NUM_THREADS": str(expect)}
