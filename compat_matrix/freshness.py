"""Whether MATRIX.json is older than the code it vouches for.

A column records the commit its tests ran from (``revision``, see ``envs.source_revision``). The matrix is stale
when a commit that changed the adapters, the host layer or the contract rows (``WATCHED``) is not contained in a
column's revision: the cells then describe code that no longer exists. ``tests/test_compat_matrix.py`` applies the
rule to the committed matrix; the remedy is ``python -m compat_matrix run``.
"""
from __future__ import annotations

import subprocess
from pathlib import Path

WATCHED = ("adapters", "zephon/host", "compat_matrix/contracts.py")
REMEDY = "run `python -m compat_matrix run` (from a clean work tree) and commit MATRIX.md and MATRIX.json"


class NotAGitClone(RuntimeError):
    """The directory is not a git work tree, is a shallow clone, or git is absent: freshness cannot be judged."""


def _git(repo: Path, *args: str) -> subprocess.CompletedProcess:
    try:
        return subprocess.run(["git", *args], cwd=repo, capture_output=True, text=True, timeout=60)
    except OSError as e:
        raise NotAGitClone(f"git cannot run in {repo}: {e}") from None


def last_change(repo: Path, paths=WATCHED) -> str:
    """The full hash of the last commit reachable from HEAD that changed any of ``paths`` (repo-relative).

    repo: the work tree. paths: files or folders. Raises ``NotAGitClone`` outside a git work tree or in a shallow clone,
    RuntimeError when git finds no such commit."""
    inside = _git(repo, "rev-parse", "--is-inside-work-tree")
    if inside.returncode != 0 or inside.stdout.strip() != "true":
        raise NotAGitClone(f"{repo} is not a git work tree ({inside.stderr.strip() or inside.stdout.strip()})")
    # A shallow clone (CI's `--depth 1`) lacks the commits the columns ran at: nothing can be judged from it.
    if _git(repo, "rev-parse", "--is-shallow-repository").stdout.strip() == "true":
        raise NotAGitClone(f"{repo} is a shallow clone: the history to judge the matrix by is missing "
                           f"(`git fetch --unshallow`)")
    out = _git(repo, "log", "-1", "--format=%H", "HEAD", "--", *paths)
    if out.returncode != 0 or not out.stdout.strip():
        raise RuntimeError(f"git log found no commit changing {list(paths)} in {repo}: {out.stderr.strip()}")
    return out.stdout.strip()


def stale_columns(matrix: dict, repo: Path, paths=WATCHED) -> list[str]:
    """One line per column of ``matrix`` (MATRIX.json's content) whose source revision does not contain the last
    commit that changed ``paths``; empty when every column is current.

    A revision with ``+changes`` (run from a dirty tree) is judged by its commit. Raises ``NotAGitClone``."""
    change = last_change(repo, paths)
    subject = _git(repo, "log", "-1", "--format=%h %cs %s", change).stdout.strip()
    subject = subject if len(subject) <= 100 else subject[:99] + "…"
    problems = []
    for env in matrix["envs"]:
        rev = (env.get("revision") or "").split("+")[0]
        if not rev:
            problems.append(f"{env['name']}: no source revision recorded")
            continue
        known = _git(repo, "cat-file", "-e", f"{rev}^{{commit}}")
        if known.returncode != 0:
            problems.append(f"{env['name']}: revision {rev} is not in this clone's history (a shallow clone, or "
                            f"a commit that was never pushed)")
            continue
        if _git(repo, "merge-base", "--is-ancestor", change, rev).returncode != 0:
            problems.append(f"{env['name']}: ran at {rev} ({env.get('date', '?')}), before {subject}")
    return problems
