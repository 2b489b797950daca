"""Zephon for plain PyTorch and TorchTitan.

- ``ZephonIterableDataset``: a rank's Zephon pipeline as a torch ``IterableDataset``; DataLoader workers
  split the rank's lanes.
- ``DataLoader`` / ``StatefulDataLoader``: torch's and torchdata's loaders whose ``state_dict`` is the
  rank's (or, under torch.distributed, the merged) Zephon checkpoint: plain JSON, valid for another
  ``num_workers`` and another dp degree.
- ``ZephonTextDataLoader`` (``zephon_torch.titan``): TorchTitan's ``BaseDataLoader`` contract, with a
  DCP-storable state that stays valid when the dp degree changes.
"""
from .dataset import ZephonIterableDataset, dp_from_environment, to_torch
from .loader import DataLoader, StatefulDataLoader

__all__ = ["DataLoader", "StatefulDataLoader", "ZephonIterableDataset", "dp_from_environment", "to_torch"]
