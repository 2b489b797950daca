"""Tokenization with a Hugging Face ``tokenizers.Tokenizer``, or a byte-level fallback (stateless, runs on
workers).

``tokenizers`` is optional: it has no wheel for free-threaded CPython 3.13t, so ``tokenizer="bytes"`` (a
``ByteTokenizer``) works without it, and asking for a ``tokenizer.json`` without it raises ``ImportError``
saying so. Both are thread-safe: ``tokenizers.Tokenizer.encode_batch`` takes no lock and mutates nothing
(its Rust ``&self``), ``ByteTokenizer`` holds no state.
"""
from __future__ import annotations

import hashlib
import json
import os

import numpy as np

from .base import Operator, RecordError

BYTE_SPECIALS = ("<pad>", "<bos>", "<eos>")  # ByteTokenizer ids 0, 1, 2; byte b is id b + 3


class _Encoding:
    __slots__ = ("ids",)

    def __init__(self, ids: list):
        self.ids = ids


class ByteTokenizer:
    """Byte-level tokenizer: UTF-8 byte ``b`` is token ``b + 3``; ids 0, 1, 2 are ``<pad>``, ``<bos>``,
    ``<eos>`` (vocabulary of 259). No state, no dependency: the fallback where ``tokenizers`` is absent.
    Implements the part of ``tokenizers.Tokenizer`` that ``Tokenize`` and ``CaptionTokens`` use."""

    offset = len(BYTE_SPECIALS)

    def encode_batch(self, texts, add_special_tokens: bool = False) -> list:
        """``texts``: list of str. Returns objects with ``.ids`` (a fresh list of ints per text).
        Raises ``TypeError`` for a text that is not a str or has no UTF-8 form (a lone surrogate)."""
        out = []
        for t in texts:
            if not isinstance(t, str):
                raise TypeError(f"expected str, got {type(t).__name__}")
            try:
                b = t.encode("utf-8")
            except UnicodeEncodeError as e:
                raise TypeError(str(e)) from None
            out.append(_Encoding((np.frombuffer(b, np.uint8).astype(np.int64) + self.offset).tolist()))
        return out

    encode_batch_fast = encode_batch

    def decode(self, ids) -> str:
        """Token ids -> text (special tokens dropped; invalid UTF-8 replaced)."""
        return bytes(int(i) - self.offset for i in ids if int(i) >= self.offset).decode("utf-8", "replace")

    def get_vocab_size(self, with_added_tokens: bool = True) -> int:
        return 256 + self.offset

    def token_to_id(self, token: str):
        return BYTE_SPECIALS.index(token) if token in BYTE_SPECIALS else None

    def to_str(self) -> str:
        return json.dumps({"zephon_tokenizer": "bytes", "specials": list(BYTE_SPECIALS)})

    def __eq__(self, other):
        return isinstance(other, ByteTokenizer)

    def __hash__(self):
        return hash(ByteTokenizer)


def token_id(tokenizer, tok) -> int | None:
    """The id of special token ``tok`` in ``tokenizer``: a token string, an id (checked), or None (none).

    Raises ``ValueError`` for an id outside the vocabulary or a string that is not in it."""
    if tok is None:
        return tok
    if isinstance(tok, int):
        if not 0 <= tok < tokenizer.get_vocab_size(with_added_tokens=True):
            raise ValueError(f"token id {tok} is outside the tokenizer's vocabulary "
                             f"(size {tokenizer.get_vocab_size(with_added_tokens=True)})")
        return tok
    tid = tokenizer.token_to_id(tok)
    if tid is None:
        raise ValueError(f"token {tok!r} is not in the tokenizer's vocabulary; pass its id or None")
    return tid


def load_tokenizer(tokenizer):
    """A tokenizer from a ``tokenizers.Tokenizer``, a path to a ``tokenizer.json`` file, its JSON text, or
    ``"bytes"`` / a ``ByteTokenizer`` (the byte-level fallback, no dependency).
    Raises ``ImportError`` when a ``tokenizers`` tokenizer is asked for and the package is not installed
    (no wheel for free-threaded Python), ``FileNotFoundError`` / ``ValueError`` when neither loads."""
    if isinstance(tokenizer, ByteTokenizer) or (isinstance(tokenizer, str) and tokenizer == "bytes"):
        return ByteTokenizer()
    try:
        from tokenizers import Tokenizer
    except ImportError:
        raise ImportError(f"tokenizer {str(tokenizer)[:200]!r} needs the `tokenizers` package, which is not "
                          f"installed here (it has no wheel for free-threaded CPython 3.13t): install it "
                          f"(pip install tokenizers), or use tokenizer='bytes' for the byte-level fallback") from None

    if isinstance(tokenizer, Tokenizer):
        return tokenizer
    try:
        if isinstance(tokenizer, (str, os.PathLike)) and os.path.exists(tokenizer):
            return Tokenizer.from_file(os.fspath(tokenizer))
        if isinstance(tokenizer, str) and tokenizer.lstrip().startswith("{"):
            return Tokenizer.from_str(tokenizer)
    except Exception as e:  # tokenizers raises a bare Exception for a file that is not a tokenizer
        raise ValueError(f"tokenizer {str(tokenizer)[:200]!r} is not a tokenizers JSON file: {e}") from None
    if isinstance(tokenizer, (str, os.PathLike)):  # a path that is not there: say so, and where it was looked for
        raise FileNotFoundError(f"tokenizer file {os.fspath(tokenizer)!r} does not exist (looked for "
                                f"{os.path.abspath(tokenizer)}); pass the path of a tokenizers tokenizer.json, its "
                                f"JSON text, or 'bytes' for the byte-level tokenizer")
    raise FileNotFoundError(f"tokenizer {tokenizer!r}: not a tokenizers.Tokenizer, a tokenizer.json path or its JSON")


class Tokenize(Operator):
    """Text field -> ``input_ids`` (int32 numpy array of token ids).

    Args:
        tokenizer: ``tokenizers.Tokenizer``, path to ``tokenizer.json``, its JSON text, or ``"bytes"``
            (``ByteTokenizer``: no dependency).
        field: text field to read (records from ``Decode``).
        bos_id / eos_id: token ids added at document start / end when ``add_bos`` / ``add_eos``
            (looked up as ``bos_token`` / ``eos_token`` in the vocabulary when given as strings).
        max_length: documents longer than this many tokens (after BOS/EOS) are split into consecutive
            pieces of at most ``max_length`` tokens, numbered by ``__piece__`` (nothing is dropped).
    Output records: ``{"input_ids": int32[n], "num_tokens": n, "__src__": ..., "__piece__": k}``.
    The tokenizer's own special-token template is not applied (``add_special_tokens=False``); BOS/EOS
    handling is ours so it is the same for every tokenizer."""

    name = "tokenize"

    def __init__(self, tokenizer, *, field: str = "text", bos_id=None, eos_id=None,
                 add_bos: bool = False, add_eos: bool = True, max_length: int | None = None):
        self.tokenizer = load_tokenizer(tokenizer)
        self.field = field
        self.bos_id = self._token_id(bos_id) if add_bos else None
        self.eos_id = self._token_id(eos_id) if add_eos else None
        if add_bos and self.bos_id is None:
            raise ValueError("add_bos=True needs bos_id (an int or a token string in the vocabulary)")
        if add_eos and self.eos_id is None:
            raise ValueError("add_eos=True needs eos_id (an int or a token string in the vocabulary)")
        if max_length is not None and max_length < 1:
            raise ValueError(f"Tokenize(max_length={max_length!r}): pass an int >= 1 (tokens per piece; with Pack, "
                             f"at most Pack's max_length) or None (no split)")
        self.max_length = max_length
        self._digest = hashlib.sha256(self.tokenizer.to_str().encode()).hexdigest()[:16]
        self._encode = getattr(self.tokenizer, "encode_batch_fast", self.tokenizer.encode_batch)

    def _token_id(self, tok):
        return token_id(self.tokenizer, tok)

    def fingerprint(self) -> dict:
        return {"op": self.name, "tokenizer_sha256": self._digest, "field": self.field, "bos_id": self.bos_id,
                "eos_id": self.eos_id, "max_length": self.max_length}

    def __getstate__(self):  # tokenizers pickles itself as JSON; drop the bound method
        state = dict(self.__dict__)
        state.pop("_encode")
        return state

    def __setstate__(self, state):
        self.__dict__.update(state)
        self._encode = getattr(self.tokenizer, "encode_batch_fast", self.tokenizer.encode_batch)

    def process_many(self, records: list[dict]) -> list[dict]:
        if not records:
            return []
        f = self.field
        try:
            texts = [r[f] for r in records]
        except KeyError:
            bad = next(r for r in records if f not in r)
            raise RecordError(f"missing field {f!r} for tokenize", bad) from None
        try:
            encs = self._encode(texts, add_special_tokens=False)
        except TypeError:  # e.g. a lone surrogate that has no UTF-8 form: find and name the record
            for r, t in zip(records, texts):
                if not isinstance(t, str):
                    raise RecordError(f"field {f!r} is {type(t).__name__}, expected text", r) from None
                try:
                    t.encode("utf-8")
                except UnicodeEncodeError as e:
                    raise RecordError(f"field {f!r} has no UTF-8 form: {e}", r) from None
            raise
        out = []
        bos, eos, ml = self.bos_id, self.eos_id, self.max_length
        for r, enc in zip(records, encs):
            ids = enc.ids  # a fresh list per call
            if bos is not None:
                ids.insert(0, bos)
            if eos is not None:
                ids.append(eos)
            arr = np.asarray(ids, dtype=np.int32)
            src = r["__src__"]
            if ml is None or arr.size <= ml:
                out.append({"input_ids": arr, "num_tokens": int(arr.size), "__src__": src, "__piece__": 0})
            else:
                for k, start in enumerate(range(0, arr.size, ml)):
                    piece = arr[start:start + ml]
                    out.append({"input_ids": piece, "num_tokens": int(piece.size), "__src__": src, "__piece__": k})
        return out
