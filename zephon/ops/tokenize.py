"""Tokenization with a Hugging Face ``tokenizers.Tokenizer`` (stateless, runs on workers)."""
from __future__ import annotations

import hashlib
import os

import numpy as np

from .base import Operator, RecordError


def load_tokenizer(tokenizer):
    """A ``tokenizers.Tokenizer`` from an instance, a path to a ``tokenizer.json`` file, or its JSON text.
    Raises ``FileNotFoundError`` / ``ValueError`` when neither loads."""
    from tokenizers import Tokenizer

    if isinstance(tokenizer, Tokenizer):
        return tokenizer
    try:
        if isinstance(tokenizer, (str, os.PathLike)) and os.path.exists(tokenizer):
            return Tokenizer.from_file(os.fspath(tokenizer))
        if isinstance(tokenizer, str) and tokenizer.lstrip().startswith("{"):
            return Tokenizer.from_str(tokenizer)
    except Exception as e:  # tokenizers raises a bare Exception for a file that is not a tokenizer
        raise ValueError(f"tokenizer {str(tokenizer)[:200]!r} is not a tokenizers JSON file: {e}") from None
    raise FileNotFoundError(f"tokenizer {tokenizer!r}: not a tokenizers.Tokenizer, a tokenizer.json path or its JSON")


class Tokenize(Operator):
    """Text field -> ``input_ids`` (int32 numpy array of token ids).

    Args:
        tokenizer: ``tokenizers.Tokenizer``, path to ``tokenizer.json`` or its JSON text.
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
            raise ValueError(f"max_length must be >= 1, got {max_length}")
        self.max_length = max_length
        self._digest = hashlib.sha256(self.tokenizer.to_str().encode()).hexdigest()[:16]
        self._encode = getattr(self.tokenizer, "encode_batch_fast", self.tokenizer.encode_batch)

    def _token_id(self, tok):
        if tok is None:
            return tok
        if isinstance(tok, int):
            if not 0 <= tok < self.tokenizer.get_vocab_size(with_added_tokens=True):
                raise ValueError(f"token id {tok} is outside the tokenizer's vocabulary "
                                 f"(size {self.tokenizer.get_vocab_size(with_added_tokens=True)})")
            return tok
        tid = self.tokenizer.token_to_id(tok)
        if tid is None:
            raise ValueError(f"token {tok!r} is not in the tokenizer's vocabulary")
        return tid

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
