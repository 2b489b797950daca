"""The ``if __name__ == "__main__":`` guard of a script that starts ``processes`` workers.

A worker imports the parent's main script (as ``__mp_main__``, the way multiprocessing's spawn does) so that
functions defined there unpickle. A script that builds its processes Loader outside the guard would run its
whole top level again in every worker. ``check_main_guarded`` refuses that in the parent, before any worker
starts, when the statement running is not under a guard that is false in a worker; a worker that nevertheless
reaches a processes Loader while importing the script (``check_not_importing_main``, multiprocessing's
``_check_not_importing_main``) raises too, and the parent re-raises it.
"""
from __future__ import annotations

import ast
import os
import sys
from contextlib import contextmanager

_importing_main: str | None = None  # the parent's main script, while this worker imports it


class UnguardedMainError(RuntimeError):
    """A script starts ``processes`` workers from its top level, outside ``if __name__ == "__main__":``."""


def _message(script) -> str:
    return (f"runner='processes' starts worker processes that import your main script ({script}) to find the "
            f"pipeline's functions, as multiprocessing's spawn does; that script builds its processes Loader at its "
            f"top level, so the whole top level would run again in every worker. Put the script's work under "
            f"`if __name__ == \"__main__\":` (keep Map/Filter functions at module level), or use runner='threads'")


@contextmanager
def importing_main(script: str):
    """Mark this worker as importing the parent's main script ``script`` (a path or module name)."""
    global _importing_main
    _importing_main = script
    try:
        yield
    finally:
        _importing_main = None


def check_not_importing_main() -> None:
    """Raise ``UnguardedMainError`` when called while this worker imports the parent's main script."""
    if _importing_main is not None:
        raise UnguardedMainError(_message(_importing_main))


def _guarded(tree: ast.Module, line: int, namespace: dict) -> bool:
    """Whether line ``line`` of the module ``tree`` sits under an ``if`` on ``__name__`` that a worker's import
    (``__name__ == "__mp_main__"``) skips. A test that cannot be evaluated counts as a guard (never a false alarm)."""
    body = tree.body
    while body:
        node = next((n for n in body if n.lineno <= line <= (n.end_lineno or n.lineno)), None)
        if node is None:
            return False
        if isinstance(node, ast.If) and any(isinstance(n, ast.Name) and n.id == "__name__"
                                            for n in ast.walk(node.test)):
            try:
                in_worker = bool(eval(compile(ast.Expression(node.test), "<guard>", "eval"),
                                      {**namespace, "__name__": "__mp_main__"}))
            except Exception:  # noqa: BLE001 (an unusual guard: let the worker-side check judge)
                return True
            in_body = any(n.lineno <= line <= (n.end_lineno or n.lineno) for n in node.body)
            if in_body != in_worker:
                return True  # a worker's import takes the other branch
        body = [c for f in ("body", "orelse", "finalbody", "handlers") for c in getattr(node, f, [])
                if isinstance(c, (ast.stmt, ast.excepthandler))]
    return False


def check_main_guarded() -> None:
    """Raise ``UnguardedMainError`` (in the parent, before any worker starts) when the main script's top level is
    building a processes runner outside its ``__main__`` guard; or, in a worker, while it imports that script.
    Silent when the main module has no source file (``python -c``, a notebook), is a package's ``__main__`` (which a
    worker does not import), or its source cannot be read."""
    check_not_importing_main()
    main = sys.modules.get("__main__")
    path = getattr(main, "__file__", None)
    name = getattr(getattr(main, "__spec__", None), "name", None)
    if not path or (name is not None and (name == "__main__" or name.endswith(".__main__"))) or \
            os.path.splitext(os.path.basename(path))[0] == "ipython":
        return  # spawn's preparation does not import these (multiprocessing.spawn._fixup_main_from_*)
    frame = sys._getframe(1)
    while frame is not None and not (frame.f_globals is main.__dict__ and frame.f_code.co_name == "<module>"):
        frame = frame.f_back
    if frame is None:
        return
    try:
        with open(path, encoding="utf-8") as f:
            tree = ast.parse(f.read())
    except (OSError, SyntaxError, ValueError):
        return
    if not _guarded(tree, frame.f_lineno, main.__dict__):
        raise UnguardedMainError(_message(path))
