"""Which tests prove which contract row, read statically: ``@pytest.mark.contract("<row id>", ...)`` marks
found with ``ast`` in tests/test_*.py (no test module is imported, so a missing host framework cannot hide
a tag): decorators of test functions and methods, ``pytestmark`` of modules and classes,
``pytest.param(..., marks=...)`` inside them. Used by tests/test_contract_map.py and, for modules that
skip or fail at import, by the recording plugin.
"""
from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
TESTS = REPO / "tests"


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


def collect_tags(tests_dir: Path = TESTS, root: Path = REPO):
    """Static map of the contract tags: ({"tests/test_x.py::test_name": [row ids]} over every
    ``tests_dir/test_*.py``, keys relative to ``root`` as pytest node ids without parameters; a list of
    malformed marks, each naming its test)."""
    tags, problems = defaultdict(list), []

    def add(where, exprs):
        for expr in exprs:
            for ids, problem in _marks_in(expr):
                if problem:
                    problems.append(f"{where}: {problem}")
                tags[where].extend(ids)

    for path in sorted(tests_dir.glob("test_*.py")):
        rel = path.relative_to(root).as_posix()
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        module_marks = _pytestmark(tree.body)

        def visit(body, prefix, inherited):
            for node in body:
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name.startswith("test"):
                    where = f"{rel}::{prefix}{node.name}"
                    add(where, inherited + node.decorator_list)
                elif isinstance(node, ast.ClassDef) and node.name.startswith("Test"):
                    visit(node.body, f"{prefix}{node.name}::",
                          inherited + node.decorator_list + _pytestmark(node.body))

        visit(tree.body, "", module_marks)
    return {k: v for k, v in tags.items() if v}, problems
