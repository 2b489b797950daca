"""A script using runner='processes' without ``if __name__ == "__main__":`` is refused in the parent, before any
worker starts, with an error naming the fix (multiprocessing's spawn raises for the same mistake; here not even the
code before the Loader runs twice); guarded scripts, and a package's ``__main__.py`` (which workers do not import),
run. Oracle: each script's own output, counted here, and its exit code (real subprocesses)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

BODY = """
import os
from zephon import Batch, Decode, Loader, Map, open_dataset


def shout(r):
    r["text"] = r["text"].upper()
    return r


def main():
    print("TOP", os.getpid(), flush=True)
    loader = Loader([open_dataset({data!r})], [Decode("text"), Map(shout), Batch(4)], runner="processes",
                    num_workers=2, canonical_replicas=2, exhaustion="stop")
    for mb in loader:
        print("LOOP", os.getpid(), len(mb["text"]), flush=True)
"""
TAILS = {
    "unguarded": "main()\n",
    "guarded": 'if __name__ == "__main__":\n    main()\n',
    "guarded_else": ('try:\n    if __name__ != "__main__":\n        pass\n    else:\n        main()\n'
                     'finally:\n    pass\n'),
}


def _run(tmp_path, kind: str) -> subprocess.CompletedProcess:
    data = tmp_path / "a.jsonl"
    data.write_text("".join(json.dumps({"text": f"doc {i}"}) + "\n" for i in range(16)))
    code = textwrap.dedent(BODY.format(data=str(data))) + "\n\n" + TAILS.get(kind, "main()\n")
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), root, os.path.join(root, "adapters")])}
    if kind == "package":  # python -m pkg: an unguarded __main__.py, which spawn's preparation never imports
        (tmp_path / "pkg").mkdir()
        (tmp_path / "pkg" / "__init__.py").write_text("")
        fn = code[code.index("def shout"):code.index("def main")]
        (tmp_path / "pkg" / "fns.py").write_text(fn)  # a package __main__'s own functions never unpickle in workers
        (tmp_path / "pkg" / "__main__.py").write_text(code.replace(fn, "from pkg.fns import shout\n\n\n"))
        cmd = [sys.executable, "-m", "pkg"]
    else:
        (tmp_path / f"{kind}.py").write_text(code)
        cmd = [sys.executable, str(tmp_path / f"{kind}.py")]
    return subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)


def test_unguarded_script_is_refused_naming_the_fix(tmp_path):
    r = _run(tmp_path, "unguarded")
    assert r.returncode != 0, r.stdout + r.stderr
    assert 'if __name__ == "__main__":' in r.stderr and "UnguardedMainError" in r.stderr
    assert [x.split()[0] for x in r.stdout.splitlines()] == ["TOP"]  # its code ran once, in the parent only


@pytest.mark.parametrize("kind", ["guarded", "guarded_else", "package"])
def test_guarded_script_runs(tmp_path, kind):
    r = _run(tmp_path, kind)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert sum(int(x.split()[2]) for x in lines if x.startswith("LOOP")) == 16
    assert len({x.split()[1] for x in lines}) == 1  # everything printed by one process: nothing re-ran
    assert sum(x.startswith("TOP") for x in lines) == 1
