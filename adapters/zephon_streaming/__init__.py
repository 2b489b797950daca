"""Zephon for Mosaic Composer / llm-foundry: ``StreamingDataset``, ``Stream`` and ``StreamingDataLoader``
with mosaicml-streaming 0.13's keyword names, on Zephon's lanes (see docs/streaming.md)."""
from .dataset import StreamingDataset
from .keywords import RefusedKeyword, Stream, detect_world
from .loader import StreamingDataLoader
from .metrics import ZephonMetrics
from .state import STATE_FORMAT

__all__ = ["STATE_FORMAT", "RefusedKeyword", "Stream", "StreamingDataLoader", "StreamingDataset", "ZephonMetrics",
           "detect_world"]
