"""Energon's ``field_map`` syntax: which part (and which key inside a decoded part) fills a sample field.

``"jpg,png"`` lists alternatives (the first that works wins); ``"json[a][0]"`` reads part ``json``, then
key ``a``, then list index 0.
"""
from __future__ import annotations

import re

_FIELD_SPLIT = re.compile(r"^(?P<field_name>[^[\]]+)(?P<access>(?:\[([^[\]]+)])*)$")


def split_field_access(desc: str) -> list[list[str]]:
    """Parse one field_map value as Energon's ``split_field_access`` does.

    desc: e.g. ``"jpg,png"`` -> ``[["jpg"], ["png"]]``; ``"json[a][0]"`` -> ``[["json", "a", "0"]]``.
    Returns one access path (part name, then keys / list indices as strings) per alternative; an
    alternative that does not parse becomes the whole ``desc`` as a part name, as in Energon.
    """
    out = []
    for option in desc.split(","):
        m = _FIELD_SPLIT.match(option)
        if m:
            out.append([m.group("field_name")] + [a.lstrip("[").rstrip("]")
                                                  for a in m.group("access").split("][") if a])
        else:
            out.append([desc])
    return out


def _access(value, path: list[str]):
    for p in path:
        if isinstance(value, dict):
            value = value[p]
        elif isinstance(value, list):
            value = value[int(p)]
        else:
            raise ValueError(f"cannot access {p!r} in a {type(value).__name__}")
    return value


def field_access(sample: dict, options: list[list[str]]):
    """Value of one field_map entry, as Energon's ``field_access``.

    sample: ``{part name: decoded part, "__key__": ..., ...}``.
    options: ``split_field_access`` of the entry; tried in order.
    Raises the last alternative's KeyError / ValueError / IndexError / TypeError when none works
    (earlier alternatives' errors only move on to the next one).
    """
    for opt in options[:-1]:
        try:
            return _access(sample, opt)
        except (KeyError, ValueError, IndexError, TypeError):
            pass
    return _access(sample, options[-1])
