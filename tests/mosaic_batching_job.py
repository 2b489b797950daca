"""One rank of mosaicml-streaming's own StreamingDataset, for the batching-method oracle of
``test_streaming_batching.py``: ``python tests/mosaic_batching_job.py CONFIG.json OUT.json`` under RANK /
WORLD_SIZE / LOCAL_WORLD_SIZE / MASTER_ADDR / MASTER_PORT (real gloo when the world is larger than one).

CONFIG: ``{"streams": [dir, ...], "kwargs": {StreamingDataset keywords}}``. OUT: this rank's device
batches of one epoch, each a list of sample ids (the ``id`` column), in order.
"""
from __future__ import annotations

import json
import sys
import warnings


def main(config_path: str, out_path: str) -> None:
    from streaming import Stream, StreamingDataset
    from torch.utils.data import DataLoader

    with open(config_path) as f:
        config = json.load(f)
    warnings.simplefilter("ignore")
    ds = StreamingDataset(streams=[Stream(local=d) for d in config["streams"]], **config["kwargs"])
    batches = [b["id"].tolist() for b in DataLoader(ds, batch_size=config["kwargs"]["batch_size"])]
    with open(out_path, "w") as f:
        json.dump(batches, f)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
