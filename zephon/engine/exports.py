"""Lazy package exports (PEP 562): a package's public names are imported on first use, not with the package.

A spawned worker of the ``processes`` runner imports ``zephon.engine.runners.worker`` and unpickles its stage;
importing every public module with the package (checkpoints, explain, the formats' registry) cost it about 0.1 s
of start-up, before its first unit.
"""
from __future__ import annotations

import importlib


def lazy_exports(package: str, exports: dict[str, str]):
    """``(__getattr__, __dir__)`` for ``package``'s ``__init__``.

    package: the package's ``__name__``. exports: ``{public name: module relative to package}``, imported on first
    access (then kept in the package's namespace). Any other name that is a submodule is imported as such, so
    ``zephon.checkpoint`` works after a bare ``import zephon`` as before. Raises AttributeError for anything else."""
    def __getattr__(name: str):
        module = importlib.import_module(package)
        if name in exports:
            value = getattr(importlib.import_module(exports[name], package), name)
        else:
            try:
                value = importlib.import_module(f"{package}.{name}")
            except ModuleNotFoundError as e:
                if e.name != f"{package}.{name}":
                    raise
                raise AttributeError(f"module {package!r} has no attribute {name!r}") from None
        setattr(module, name, value)
        return value

    def __dir__():
        return sorted(set(vars(importlib.import_module(package))) | set(exports))

    return __getattr__, __dir__
