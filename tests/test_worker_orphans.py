"""A killed training process leaves no loader worker behind.

torch's DataLoader worker notices a dead parent only between items, then joins its queue's feeder thread; with
items larger than a pipe's buffer (Zephon's workers send pickled numpy micro-batches) nobody reads the pipe any
more and that join blocks for ever, so the worker would outlive the training process, holding its memory.

Oracle: the process table. The test starts a real training-like process (zephon_torch.DataLoader, 2 workers,
2048-token rows), SIGKILLs it after two batches and waits for its worker processes to end.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

pytest.importorskip("torch")

CHILD = textwrap.dedent("""
    import json, sys, time
    import zephon_torch
    from zephon.formats import open_dataset
    from zephon.ops import Batch, Decode, Pack, Tokenize
    data, tok = sys.argv[1], sys.argv[2]
    ops = [Decode("text"), Tokenize(tok, eos_id="<eos>", max_length=2048), Pack(2048), Batch(1)]
    ds = zephon_torch.ZephonIterableDataset([open_dataset(data)], ops, dp_degree=1, dp_rank=0, seed=0,
                                            canonical_replicas=4, chunk_size=16)
    it = iter(zephon_torch.DataLoader(ds, num_workers=2, prefetch_factor=8))
    next(it), next(it)
    print("ready", flush=True)
    time.sleep(600)  # killed long before
""")


def _children(pid: int) -> list[int]:
    """Processes whose parent is ``pid`` (from /proc)."""
    out = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as fh:
                stat = fh.read()
        except OSError:
            continue
        if int(stat.rsplit(")", 1)[1].split()[1]) == pid:  # field 4, after the command in parentheses
            out.append(int(name))
    return out


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] != "Z"  # a zombie has ended
    except OSError:
        return False


@pytest.mark.skipif(not os.path.isdir("/proc"), reason="reads the process table from /proc")
def test_workers_end_when_the_training_process_is_killed(tmp_path, tokenizer_path):
    data = tmp_path / "docs"
    data.mkdir()
    with open(data / "part-0.jsonl", "w") as fh:  # enough 2048-token rows to fill the workers' prefetch
        for i in range(400):
            fh.write(json.dumps({"text": " ".join(f"word{i}x{k}" for k in range(300))}) + "\n")
    child = subprocess.Popen([sys.executable, "-c", CHILD, str(data), tokenizer_path], stdout=subprocess.PIPE,
                             text=True)
    workers = []
    try:
        assert child.stdout.readline().strip() == "ready"
        workers = _children(child.pid)
        time.sleep(3)  # the workers fill their prefetch: items waiting in the pipe
        assert len([p for p in workers if _alive(p)]) == 2, workers
        child.send_signal(signal.SIGKILL)
        child.wait(30)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and any(_alive(p) for p in workers):
            time.sleep(0.5)
        left = [p for p in workers if _alive(p)]
        assert not left, f"loader workers {left} outlived their killed training process by 30 s"
    finally:
        child.kill()
        for p in workers:
            try:
                os.kill(p, signal.SIGKILL)
            except OSError:
                pass


STREAMING_CHILD = textwrap.dedent("""
    import sys, time
    from torch.utils.data import DataLoader
    from zephon_streaming import StreamingDataset
    ds = StreamingDataset(local=sys.argv[1], batch_size=4, channel_dir=sys.argv[2])
    it = iter(DataLoader(ds, batch_size=4, num_workers=2))
    next(it), next(it)
    print("ready", flush=True)
    time.sleep(600)  # killed long before
""")


@pytest.mark.skipif(not os.path.isdir("/proc"), reason="pid namespaces from /proc")
@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM])
def test_a_killed_training_process_leaves_no_side_channel_behind(tmp_path, sig):
    """zephon_streaming's private directory (side channel, step exchange) of a training process killed with SIGKILL
    or SIGTERM (how torchrun stops the other ranks when one fails) runs no cleanup; the next dataset made removes
    it, and leaves the directory of a live process alone. Oracle: the directory listing."""
    pytest.importorskip("streaming")
    from streaming import MDSWriter

    data, channels = tmp_path / "mds", tmp_path / "channels"
    channels.mkdir()
    with MDSWriter(out=str(data), columns={"text": "str"}) as w:
        for i in range(64):
            w.write({"text": f"sample {i}"})
    child = subprocess.Popen([sys.executable, "-c", STREAMING_CHILD, str(data), str(channels)],
                             stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline().strip() == "ready"
        left = os.listdir(channels)
        assert len(left) == 1 and left[0].startswith("zephon-streaming-"), left
        child.send_signal(sig)
        child.wait(30)
    finally:
        child.kill()
        child.wait()
    assert os.listdir(channels) == left  # nothing ran on the way out
    from zephon_streaming import StreamingDataset

    live = StreamingDataset(local=str(data), batch_size=4, channel_dir=str(channels))
    assert os.listdir(channels) == [os.path.basename(live._channel.root)]  # the orphan is gone
    StreamingDataset(local=str(data), batch_size=4, channel_dir=str(channels))
    assert os.path.basename(live._channel.root) in os.listdir(channels)  # a live owner's is kept
