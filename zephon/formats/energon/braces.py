"""Bash-style brace expansion of shard names, as Energon expands ``split.yaml`` entries.

Energon uses the ``braceexpand`` package; this is an independent implementation of its semantics
(``{a,b}``, zero-padded integer ranges, steps, letter ranges, nesting, backslash escapes) so the reader
does not depend on it.
"""
from __future__ import annotations

import re
import string
from itertools import chain, product

_INT_RANGE = re.compile(r"^(-?\d+)\.\.(-?\d+)(?:\.\.-?(\d+))?$")
_CHAR_RANGE = re.compile(r"^([A-Za-z])\.\.([A-Za-z])(?:\.\.-?(\d+))?$")
_ALPHABET = string.ascii_uppercase + string.ascii_lowercase
_UNESCAPE = re.compile(r"\\(.)")


def braceexpand(pattern: str) -> list[str]:
    """All expansions of ``pattern``, in the ``braceexpand`` package's order.

    pattern: e.g. ``"data-{000..009}.tar"`` (zero padding kept), ``"{a,b}-{1..9..2}"``, ``"{a..e}"``,
    ``"x\\{y"`` (an escaped, literal brace). Text without braces expands to itself.
    Raises ValueError for unbalanced braces.
    """
    return ["".join(_flatten(t)) for t in _parse_pattern(pattern)]


def _flatten(t):
    out = []
    for item in t:
        if isinstance(item, tuple):
            out.extend(_flatten(item))
        else:
            out.append(item)
    return [_UNESCAPE.sub(r"\1", "".join(out))]


def _parse_pattern(pattern: str):
    """Product of the literal pieces and brace groups of ``pattern`` (a lazy iterator of tuples)."""
    start = depth = 0
    items = []
    for pos, c in _unescaped(pattern):
        if c == "{":
            if depth == 0 and pos > start:
                items.append([pattern[start:pos]])
                start = pos
            depth += 1
        elif c == "}":
            depth -= 1
            if depth == 0:
                expr = pattern[start + 1:pos]
                item = _parse_expression(expr)
                if item is None:  # not a range nor a list: the braces are literal text
                    items.extend([["{"], list(_parse_pattern(expr)), ["}"]])
                else:
                    items.append(list(item))
                start = pos + 1
    if depth != 0:
        raise ValueError(f"unbalanced braces: {pattern!r}")
    if start < len(pattern):
        items.append([pattern[start:]])
    return product(*items)


def _unescaped(text: str):
    """``(position, character)`` of the characters of ``text`` that are not backslash-escaped (an escape
    and the character after it are skipped)."""
    pos = 0
    while pos < len(text):
        if text[pos] == "\\":
            pos += 2
            continue
        yield pos, text[pos]
        pos += 1


def _parse_expression(expr: str):
    """The expansions of one brace group's inside: an int range, a letter range, or a comma list (None
    when it is none of those)."""
    m = _INT_RANGE.match(expr)
    if m:
        a, b, step = m.groups()
        # braceexpand pads to the longer bound only when a bound is written with a leading zero
        pad = max(len(a), len(b)) if any(s.startswith(("0", "-0")) for s in (a, b) if s not in ("0", "-0")) else 0
        step = (int(step) or 1) if step else 1
        ia, ib = int(a), int(b)
        r = range(ia, ib + 1, step) if ia < ib else range(ia, ib - 1, -step)
        return ["%0*d" % (pad, i) for i in r]
    m = _CHAR_RANGE.match(expr)
    if m:
        a, b, step = m.groups()
        step = (int(step) or 1) if step else 1
        ia, ib = _ALPHABET.index(a), _ALPHABET.index(b)
        if ia < ib:
            return list(_ALPHABET[ia:ib + 1:step])
        ib = ib or -len(_ALPHABET)
        return list(_ALPHABET[ia:ib - 1:-step])
    return _parse_sequence(expr)


def _parse_sequence(seq: str):
    """A top-level comma list ``a,b{c,d}`` -> chained expansions of its items (None without a comma)."""
    start = depth = 0
    items = []
    for pos, c in _unescaped(seq):
        if c == "{":
            depth += 1
        elif c == "}":
            depth -= 1
        elif c == "," and depth == 0:
            items.append(_parse_pattern(seq[start:pos]))
            start = pos + 1
    if depth != 0 or not items:
        return None
    items.append(_parse_pattern(seq[start:]))
    return chain(*items)
