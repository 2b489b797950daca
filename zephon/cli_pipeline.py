"""The pipeline the CLI's flags describe (``zephon demo``, ``verify``, ``explain``, ``diff``): datasets opened from
``--data``, the text operators, the tokenizer, and the ``Loader`` factory."""
from __future__ import annotations

from .cli_formats import numbers as _numbers


def open_datasets(args) -> list:
    """One Dataset per ``--data`` path, opened with its format's own flags (``cli_formats``). Energon
    samples are dicts of parts, so no columns are asked of them (``text_ops`` lifts the text field)."""
    from .cli_formats import open_keywords
    from .formats import open_dataset

    out = []
    for i, p in enumerate(args.data):
        fmt, kw = open_keywords(args, p, i)
        columns = None if fmt == "energon" else [args.field]
        out.append(open_dataset(p, columns=columns, on_error=args.on_error, **kw))
    return out


def text_ops(datasets, args) -> list:
    """Operators that bring each record's text to ``args.field`` before ``Decode``: a ``TextField`` map when a
    dataset is Energon (text in ``__fields__`` / ``__parts__``), else none."""
    from .ops import Map
    from .verify import TextField

    if any(s.format == "energon" for d in datasets for s in d.shards[:1]):
        return [Map(TextField(args.field), name=f"text field {args.field!r}")]
    return []


def eos_token(text: str):
    """``--eos-token``: an integer id when it is all digits, else the token string."""
    return int(text) if text.isdigit() else text


def tokenize(args, tokenizer_path):
    """``Tokenize`` for ``--eos-token``; an EOS token the tokenizer lacks is a ValueError saying what to pass."""
    from .ops import Tokenize

    try:
        # concat cuts documents of any length itself; the bin packers need pieces that fit a row
        return Tokenize(tokenizer_path, field=args.field, eos_id=eos_token(args.eos_token),
                        max_length=None if getattr(args, "pack_method", None) == "concat" else args.max_length)
    except ValueError as e:
        if "vocabulary" not in str(e):
            raise
        raise ValueError(f"--eos-token {args.eos_token!r}: {e} ({tokenizer_path}). Pass --eos-token with this "
                         f"tokenizer's end-of-document token or its id; {special_tokens(tokenizer_path)}") from None


def special_tokens(tokenizer_path) -> str:
    """What to suggest for ``--eos-token``: the tokenizer's special tokens, or how to do without."""
    from .ops.tokenize import load_tokenizer

    tok = load_tokenizer(tokenizer_path)
    decoder = getattr(tok, "get_added_tokens_decoder", lambda: {})()
    special = [t.content for _, t in sorted(decoder.items()) if getattr(t, "special", False)]
    if special:
        # suggest an end-of-document token when one is there, not the first special token (often <pad>)
        hints = ("eos", "endoftext", "</s>", "end_of_text", "eot")
        best = next((t for t in special if any(h in t.lower() for h in hints)), special[0])
        return "its special tokens: " + ", ".join(repr(t) for t in special[:8]) + f", e.g. --eos-token {best!r}"
    return "it has no special tokens: pass a token id (e.g. --eos-token 0) or add an end-of-text token to it"


def build_pipeline(args, tokenizer_path):
    from .ops import Batch, Decode, EnsureMixture, Pack, Shuffle, token_corrected_weights

    datasets = open_datasets(args)
    weights = _numbers(args.weights, float, "--weights") if args.weights else [1.0] * len(datasets)
    if len(weights) != len(datasets):
        raise ValueError(f"{len(weights)} --weights for {len(datasets)} --data paths")
    if getattr(args, "schedule", None):  # verify --schedule FILE: weights that change with the step
        from .work import Schedule
        given = [flag for flag, on in (("--weights", args.weights), ("--ensure-mixture", args.ensure_mixture)) if on]
        if given:
            raise ValueError(f"--schedule replaces --weights and cannot be combined with {' or '.join(given)}")
        weights = Schedule.load(args.schedule)
        if weights.num_datasets != len(datasets):
            raise ValueError(f"{args.schedule}: a schedule of {weights.num_datasets} datasets for {len(datasets)} "
                             f"--data paths")
    tok = tokenize(args, tokenizer_path)
    decode = Decode(args.field)
    ops = [*text_ops(datasets, args), decode, tok]
    if args.ensure_mixture and len(datasets) > 1:
        # sample weights from measured document lengths, so token shares (not sample shares) hit the target
        ops.append(EnsureMixture(weights))

        def tokens(recs):
            for op in ops[:-1]:  # what precedes EnsureMixture: text lift, decode, tokenize
                recs = op.process_many(recs)
            return [r["num_tokens"] for r in recs]
        weights = token_corrected_weights(datasets, weights, tokens, seed=args.seed)
    ops.append(Pack(args.max_length, method=args.pack_method))
    if args.shuffle_buffer:
        ops.append(Shuffle(args.shuffle_buffer, seed=args.seed))

    def make_loader(dp, rank, micro_batch, runner):
        from .engine import Loader
        return Loader(datasets, ops + [Batch(micro_batch)], weights=weights, seed=args.seed,
                      canonical_replicas=args.canonical_replicas, chunk_size=args.chunk_size,
                      global_batch_size=args.global_batch_size or args.canonical_replicas * args.micro_batch,
                      flush_every_k_chunks=args.flush_every_k_chunks, dp_degree=dp, dp_rank=rank, runner=runner,
                      num_workers=args.workers)
    return datasets, make_loader
