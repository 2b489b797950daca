"""A prepared dataset's Python hooks (dataset.yaml ``sample_loader`` / ``part_filter`` naming ``"file.py:function"``).

Energon loads such a function from a file under ``.nv-meta/`` by executing the file's source in a fresh
namespace (its ``ModuleLoader``); so does ``DatasetFunction``, lazily, once per process, so it can be pickled
to workers and the hook runs there. The file's SHA-256 is part of the fingerprint: a checkpoint made with
other hook code is refused. See docs/energon.md (crude datasets and hooks).
"""
from __future__ import annotations

import hashlib
import os

from ..errors import DataError
from .nvmeta import MAIN_FOLDER


class DatasetFunction:
    """A function named ``"file.py:name"`` (or ``"file.py"`` with ``default_name``) in a dataset's ``.nv-meta/``.

    root: the dataset root. spec: the dataset.yaml value. default_name: Energon's default function name
    (``"sample_loader"`` / ``"part_filter"``).
    Attributes: ``path`` (the file), ``name``, ``digest`` (SHA-256 of its source). Calling it calls the function.
    Raises DataError naming the file when it is missing, does not compile or lacks the function."""

    def __init__(self, root: str, spec: str, default_name: str):
        module, _, name = spec.rpartition(":") if ":" in spec else (spec, "", default_name)
        self.path = os.path.join(root, MAIN_FOLDER, module)
        self.name, self.spec = name, spec
        try:
            with open(self.path, "rb") as f:
                self.source = f.read()
        except OSError as e:
            raise DataError(f"dataset.yaml names {spec!r}, which cannot be read: {e.strerror or e}",
                            path=self.path) from None
        self.digest = hashlib.sha256(self.source).hexdigest()
        self._fn = None
        self._load()  # fail at open, not on a worker

    def _load(self):
        namespace: dict = {}
        try:
            exec(compile(self.source, self.path, "exec"), namespace)  # as Energon's ModuleLoader
        except Exception as e:
            raise DataError(f"dataset.yaml hook module does not run: {type(e).__name__}: {e}", path=self.path) from None
        fn = namespace.get(self.name)
        if not callable(fn):
            raise DataError(f"dataset.yaml names {self.spec!r} but the module defines no function {self.name!r}",
                            path=self.path)
        self._fn = fn
        return fn

    def __getstate__(self):
        return {k: v for k, v in self.__dict__.items() if k != "_fn"}

    def __setstate__(self, state):
        self.__dict__.update(state)
        self._fn = None

    def __call__(self, *args):
        fn = self._fn if self._fn is not None else self._load()
        return fn(*args)

    def fingerprint(self) -> dict:
        return {"file": os.path.basename(self.path), "function": self.name, "sha256": self.digest}
