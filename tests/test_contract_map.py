"""The compatibility matrix's map: which tests prove which host-contract row (compat_matrix/contracts.py).

The ``@pytest.mark.contract("<row id>", ...)`` marks are read from the source of every tests/test_*.py with
``ast`` (no test module is imported, so a missing host framework cannot hide a tag): decorators of test
functions and methods, ``pytestmark`` of modules and classes, ``pytest.param(..., marks=...)`` inside them.
"""
from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

from compat_matrix.contracts import BY_ID, CONTRACTS

TESTS = Path(__file__).resolve().parent


def _is_contract_mark(node: ast.AST) -> bool:
    """``pytest.mark.contract`` or ``mark.contract`` (``from pytest import mark``)."""
    if not (isinstance(node, ast.Attribute) and node.attr == "contract"):
        return False
    owner = node.value
    return (isinstance(owner, ast.Name) and owner.id == "mark") or (
        isinstance(owner, ast.Attribute) and owner.attr == "mark"
        and isinstance(owner.value, ast.Name) and owner.value.id == "pytest")


def _marks_in(expr: ast.AST):
    """Every contract mark in an expression: (row ids, problem or None)."""
    calls = [n for n in ast.walk(expr) if isinstance(n, ast.Call) and _is_contract_mark(n.func)]
    called = {id(c.func) for c in calls}
    for node in ast.walk(expr):
        if _is_contract_mark(node) and id(node) not in called:
            yield [], "contract mark without arguments (name its row ids)"
    for call in calls:
        if call.keywords or not call.args:
            yield [], "contract mark without positional row ids"
        elif not all(isinstance(a, ast.Constant) and isinstance(a.value, str) for a in call.args):
            yield [], "contract mark whose row ids are not string literals"
        else:
            yield [a.value for a in call.args], None


def _pytestmark(body):
    return [s.value for s in body if isinstance(s, ast.Assign)
            and any(isinstance(t, ast.Name) and t.id == "pytestmark" for t in s.targets)]


def collect_tags():
    """{"file::test": [row ids]} over every tests/test_*.py, and a list of malformed marks."""
    tags, problems = defaultdict(list), []

    def add(where, exprs):
        for expr in exprs:
            for ids, problem in _marks_in(expr):
                if problem:
                    problems.append(f"{where}: {problem}")
                tags[where].extend(ids)

    for path in sorted(TESTS.glob("test_*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        module_marks = _pytestmark(tree.body)

        def visit(body, prefix, inherited):
            for node in body:
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name.startswith("test"):
                    where = f"{path.name}::{prefix}{node.name}"
                    add(where, inherited + node.decorator_list)
                elif isinstance(node, ast.ClassDef) and node.name.startswith("Test"):
                    visit(node.body, f"{prefix}{node.name}::",
                          inherited + node.decorator_list + _pytestmark(node.body))

        visit(tree.body, "", module_marks)
    return {k: v for k, v in tags.items() if v}, problems


def test_every_contract_tag_names_a_row():
    tags, problems = collect_tags()
    bad = [f"{where}: unknown row {i!r}" for where, ids in sorted(tags.items()) for i in ids if i not in BY_ID]
    assert not problems + bad, "contract tags that name no row of compat_matrix/contracts.py:\n" + "\n".join(
        problems + bad)


def test_every_contract_row_is_proven_by_a_test():
    tags, _ = collect_tags()
    proven = {i for ids in tags.values() for i in ids}
    unproven = [f"{c.id}: {c.title}" for c in CONTRACTS if c.id not in proven]
    assert not unproven, "rows of compat_matrix/contracts.py without a @pytest.mark.contract test:\n" + "\n".join(
        unproven)
