"""Operators (stateless work functions) and their per-lane accumulators."""
from .base import Accumulator, Operator, RecordError
from .basic import Decode, Filter, Map
from .batch import Batch, collate
from .group import GROUP_ROWS, GroupBatch
from .mixture import EnsureMixture, token_corrected_weights
from .pack import Pack
from .shuffle import Shuffle, identity
from .tokenize import ByteTokenizer, Tokenize, load_tokenizer
from .vision import CaptionTokens, DecodeImage, Normalize, RandomResizedCrop, vision_language_ops

__all__ = ["Accumulator", "Batch", "ByteTokenizer", "CaptionTokens", "Decode", "DecodeImage", "EnsureMixture",
           "Filter", "GROUP_ROWS", "GroupBatch", "Map", "Normalize", "Operator", "Pack", "RandomResizedCrop",
           "RecordError", "Shuffle", "Tokenize", "collate", "identity", "load_tokenizer", "token_corrected_weights",
           "vision_language_ops"]
