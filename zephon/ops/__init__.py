"""Operators (stateless work functions) and their per-lane accumulators."""
from .base import Accumulator, Operator, RecordError
from .basic import Decode, Filter, Map
from .batch import Batch, collate
from .mixture import EnsureMixture, token_corrected_weights
from .pack import Pack
from .shuffle import Shuffle, identity
from .tokenize import Tokenize, load_tokenizer

__all__ = ["Accumulator", "Batch", "Decode", "EnsureMixture", "Filter", "Map", "Operator", "Pack",
           "RecordError", "Shuffle", "Tokenize", "collate", "identity", "load_tokenizer", "token_corrected_weights"]
