"""Lazy package exports (zephon.engine.exports): what a spawned worker imports, and the public names still there.

Oracles: ``sys.modules`` of a fresh interpreter, and the names the package's ``__all__`` lists.
"""
from __future__ import annotations

import json
import subprocess
import sys

import pytest


def _modules_after(code: str) -> set[str]:
    out = subprocess.run([sys.executable, "-c", f"{code}\nimport sys, json; print(json.dumps(sorted(sys.modules)))"],
                         capture_output=True, text=True, timeout=120, check=True)
    return set(json.loads(out.stdout.splitlines()[-1]))


def test_a_processes_worker_imports_no_format_or_checkpoint_it_does_not_use():
    """What a ``processes`` runner worker imports before its stage arrives: no pyarrow, no Energon or MDS reader,
    no checkpoint package and no Loader (each is start-up time before the worker's first unit)."""
    mods = _modules_after("import zephon.engine.runners.worker")
    heavy = sorted(m for m in mods if m.split(".")[0] == "pyarrow" or m.startswith((
        "zephon.formats.energon", "zephon.formats.mds", "zephon.formats.parquet", "zephon.checkpoint",
        "zephon.engine.loader", "zephon.engine.explain")))
    assert heavy == []


def test_public_names_and_submodules_resolve_on_first_use():
    import zephon
    import zephon.engine

    for package in (zephon, zephon.engine):
        for name in package.__all__:
            assert getattr(package, name) is not None, f"{package.__name__}.{name}"
        assert set(package.__all__) <= set(dir(package))
    from zephon import Loader, merge_states
    from zephon.engine.loader import Loader as direct
    from zephon.checkpoint import merge_states as direct_merge
    assert Loader is direct and merge_states is direct_merge
    assert zephon.checkpoint.merge_states is direct_merge  # a submodule by attribute, as with eager imports
    with pytest.raises(AttributeError, match="has no attribute 'no_such_name'"):
        zephon.no_such_name  # noqa: B018
    with pytest.raises(ImportError):
        from zephon import no_such_name  # noqa: F401
