"""Construction-time checks of a ``Loader``'s arguments: what the user gave, and what to pass instead."""
from __future__ import annotations

import os
import warnings

from ..formats import Dataset


def check_ops(ops, num_datasets: int) -> None:
    """Catch operator combinations that would fail at the first unlucky record, at construction."""
    from ..ops import EnsureMixture, Pack, Tokenize

    tok_max = None
    for op in ops:
        if isinstance(op, Tokenize):
            tok_max = op.max_length if op.max_length is not None else float("inf")
        elif isinstance(op, Pack):
            if tok_max is None:
                raise ValueError("Pack needs tokenized records: put a Tokenize operator before it")
            if op.method == "concat" and tok_max != float("inf"):
                # concat cuts documents itself; it cannot tell a piece from a document (each starts at its own token
                # 0), so a split document's pieces would be packed as documents of their own
                warnings.warn(f"Tokenize(max_length={tok_max}) before Pack(method='concat'): each piece of a split "
                              f"document is packed as a document of its own (position_ids and cu_seqlens restart "
                              f"at it and the target of its first token is masked); concat cuts documents of any "
                              f"length itself: use Tokenize(max_length=None)", UserWarning, stacklevel=4)
            if tok_max > op.max_length and op.method != "concat":  # concat cuts documents of any length
                given = None if tok_max == float("inf") else tok_max
                raise ValueError(f"Tokenize(max_length={given}) lets documents longer than Pack(max_length="
                                 f"{op.max_length}) through (Pack refuses them); use Tokenize(max_length="
                                 f"{op.max_length}) (or less) so long documents are split into pieces that fit")
        elif isinstance(op, EnsureMixture) and len(op.weights) != num_datasets:
            raise ValueError(f"EnsureMixture has {len(op.weights)} weights for {num_datasets} datasets")


def check_datasets(datasets) -> list:
    """``datasets`` as a list, refused (``TypeError``) unless it is a list of ``formats.Dataset``."""
    hint = "datasets must be a list of open_dataset(...) results, e.g. Loader([open_dataset(path)], ops)"
    if isinstance(datasets, (str, bytes, os.PathLike, Dataset)):
        what = "a Dataset" if isinstance(datasets, Dataset) else f"{type(datasets).__name__} {datasets!r}"
        raise TypeError(f"{hint}; got {what}" + (f": use [open_dataset({datasets!r})]"
                                                 if not isinstance(datasets, Dataset) else ": wrap it in a list"))
    try:
        out = list(datasets)
    except TypeError:
        raise TypeError(f"{hint}; got {type(datasets).__name__} {datasets!r}") from None
    for k, d in enumerate(out):
        if not isinstance(d, Dataset) and not (hasattr(d, "shard_sizes") and hasattr(d, "read")):
            fix = f": use open_dataset({d!r})" if isinstance(d, (str, os.PathLike)) else ""
            raise TypeError(f"{hint}; datasets[{k}] is {type(d).__name__} {d!r}{fix}")
    return out


def check_finite_lanes(source) -> None:
    """A finite pass splits its positions over the lanes evenly by count (to within one) or by size (at least one
    each when the pass is shorter than a round: ``work.balance``). With fewer positions than
    lanes, some lanes get none: with drop_last not one step could complete, and without it a rank whose lanes
    are all empty would have no row to shape its padding on, at some dp degrees only. Refuse it at any dp."""
    total, r = source.total_positions, source.canonical_replicas
    if total < r:
        raise ValueError(f"a finite pass of {total} samples over canonical_replicas={r} lanes leaves "
                         f"{r - total} lanes without a sample; use canonical_replicas <= {total} (or repeat the "
                         f"data: exhaustion='repeat' or 'fill')")
