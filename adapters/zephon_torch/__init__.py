"""Zephon for plain PyTorch and TorchTitan.

- ``ZephonIterableDataset``: a rank's Zephon pipeline as a torch ``IterableDataset``; DataLoader workers
  split the rank's lanes.
- ``DataLoader`` / ``StatefulDataLoader``: torch's and torchdata's loaders whose ``state_dict`` is the
  rank's Zephon checkpoint (its lanes, no collective): plain JSON, valid for another ``num_workers``; at
  another dp degree ``load_state_dict(SavedRanks(...))`` reads only the old ranks' states it needs.
- ``ZephonTextDataLoader`` (``zephon_torch.titan``): TorchTitan's ``BaseDataLoader`` contract, with a
  DCP-storable state that stays valid when the dp degree changes.
"""
from .dataset import ZephonIterableDataset, dp_from_environment, to_torch
from .loader import DataLoader, StatefulDataLoader
from zephon.host import SavedRanks  # what load_state_dict takes at another dp degree (defined in the core)

__all__ = ["DataLoader", "SavedRanks", "StatefulDataLoader", "ZephonIterableDataset", "dp_from_environment",
           "to_torch"]
