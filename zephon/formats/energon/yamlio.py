"""YAML and JSON config files of Energon, typed the way megatron-energon 7.4 types them.

Energon parses ``.nv-meta`` files and metadatasets with rapidyaml (``eyaml.load_yaml``), which types
scalars differently from PyYAML's resolver: unquoted ``null``/``~`` -> None, ``true``/``yes`` -> True,
``false``/``no`` -> False, text with a ``.`` or ``e`` -> float if it parses, else int if it parses, else
str; quoted and block scalars stay strings; mapping keys are strings. We compose with PyYAML (no
object construction) and type the scalars ourselves.
"""
from __future__ import annotations

import json

from ..errors import DamagedIndexError, DataError


def _cast_scalar(s: str):
    """Energon's typing of one unquoted scalar ``s`` (see the module docstring)."""
    low = s.lower()
    if low in ("null", "~"):
        return None
    if low in ("true", "yes"):
        return True
    if low in ("false", "no"):
        return False
    try:
        if "." in s or "e" in low:
            return float(s)
        return int(s)
    except ValueError:
        return s


def _to_native(node):
    """A composed PyYAML node -> dicts, lists and Energon-typed scalars."""
    import yaml

    if isinstance(node, yaml.MappingNode):
        return {str(k.value) if isinstance(k, yaml.ScalarNode) else str(_to_native(k)): _to_native(v)
                for k, v in node.value}
    if isinstance(node, yaml.SequenceNode):
        return [_to_native(v) for v in node.value]
    if node.style is not None:  # quoted or block scalar: a string
        return node.value
    return _cast_scalar(node.value)


def load_yaml(data: bytes | str, *, path: str | None = None):
    """Parse YAML the way megatron-energon 7.4's ``eyaml.load_yaml`` types scalars.

    data: the YAML text (bytes are decoded as UTF-8 by PyYAML).
    path: file name used in error messages only.
    Returns dicts / lists / scalars, or None for an empty document.
    Raises DataError naming ``path`` for invalid YAML.
    """
    import yaml

    try:
        node = yaml.compose(data, Loader=yaml.SafeLoader)
    except yaml.YAMLError as e:
        raise DataError(f"invalid YAML: {e}", path=path) from None
    return None if node is None else _to_native(node)


def read_yaml_file(path: str):
    """``load_yaml`` of the file ``path``. Raises DataError naming it when unreadable or invalid."""
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as e:
        raise DataError(f"cannot read: {e.strerror or e}", path=path) from None
    return load_yaml(data, path=path)


def read_config_file(path: str):
    """A ``.json`` (``json.load``) or ``.yaml`` (``read_yaml_file``) config file, by extension, as Energon
    accepts both for ``.info`` and ``split`` files.

    Raises DataError naming ``path`` when unreadable, invalid, or of another extension.
    """
    if path.endswith(".json"):
        try:
            with open(path, "rb") as f:
                return json.load(f)
        except OSError as e:
            raise DataError(f"cannot read: {e.strerror or e}", path=path) from None
        except ValueError as e:
            raise DamagedIndexError(f"invalid JSON ({e}): the file is damaged or truncated; run `energon prepare` "
                            f"again or copy it back", path=path) from None
    if path.endswith(".yaml"):
        return read_yaml_file(path)
    raise DataError("config file must end in .yaml or .json", path=path)
