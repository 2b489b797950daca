"""Human-readable differences between two summarized configs (``Loader.summary``): why a checkpoint is refused
(``schema.validate``) and what ``zephon diff`` reports (``engine.diff``)."""
from __future__ import annotations


# Keys reported before their siblings: a host adapter may derive other settings from them (zephon_streaming's seed
# per epoch depends on shuffle), so the setting the user changed comes first, not a value they never saw.
_FIRST_KEYS = ("shuffle",)


def _proportions(a: list, b: list) -> tuple[str, str]:
    """``("[0.5, 0.5]", "[0.9, 0.1]")`` for the integer mixture weights ``[1, 1]`` and ``[471859, 52429]``: each
    weight's share of its total, with the fewest significant digits (4 or more) that tell the two lists apart."""
    shown = [[[f"{w / sum(v):.{d}g}" for w in v] for v in (a, b)] for d in range(4, 18)]
    a_b = next((x for x in shown if x[0] != x[1]), shown[-1])
    return f"[{', '.join(a_b[0])}]", f"[{', '.join(a_b[1])}]"


def _weights_diff(path: str, expected, found, labels) -> list[str] | None:
    """The line for differing mixture weights as proportions, or None if ``path`` holds no such pair: the summary
    keeps the weights as reduced integers (``work.mixture.integer_weights``: 0.9 and 0.1 become 471859 and
    52429), which the user never gave."""
    if path.rpartition(".")[2] != "weights" or expected == found or not all(
            isinstance(v, list) and v and all(isinstance(w, int) and w > 0 for w in v) for v in (expected, found)):
        return None
    (theirs, ours), (a, b) = labels, _proportions(found, expected)
    return [f"{path} differ: {theirs} {a} vs {ours} {b} (mixture proportions)"]


def config_diff(expected, found, path="", labels=("checkpoint", "this loader")) -> list[str]:
    """Human-readable differences between two summarized configs, e.g.
    ``["work.seed: checkpoint has 1, this loader has 0"]`` (``labels``: what ``found`` and ``expected`` are).
    Keys only one side has are not reported inside a dict whose ``method`` differs (they belong to the method).
    Mixture weights are shown as proportions (``_weights_diff``); ``shuffle`` is reported before its siblings."""
    theirs, ours = labels
    weights = _weights_diff(path, expected, found, labels)
    if weights is not None:
        return weights
    if isinstance(expected, dict) and isinstance(found, dict):
        out = []
        both = "method" not in expected or "method" not in found or expected["method"] == found["method"]
        for k in sorted(set(expected) | set(found), key=lambda k: (k not in _FIRST_KEYS, str(k))):
            p = f"{path}.{k}" if path else str(k)
            if k not in expected:
                out += [f"{p}: only in the {theirs} ({found[k]!r})"] if both else []
            elif k not in found:
                out += [f"{p}: missing from the {theirs} ({ours} has {expected[k]!r})"] if both else []
            else:
                out.extend(config_diff(expected[k], found[k], p, labels))
        return out
    if isinstance(expected, list) and isinstance(found, list) and len(expected) == len(found):
        out = []
        for i, (a, b) in enumerate(zip(expected, found)):
            out.extend(config_diff(a, b, f"{path}[{i}]", labels))
        return out
    if expected != found:
        return [f"{path}: {theirs} has {found!r}, {ours} has {expected!r}"]
    return []
