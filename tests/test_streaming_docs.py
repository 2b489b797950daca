"""docs/streaming.md's keyword table against the installed mosaicml-streaming: every keyword of
``streaming.StreamingDataset.__init__`` (read with ``inspect``) has one row with a known status, and every row names a
keyword ``zephon_streaming.StreamingDataset`` accepts."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from helpers import host_keywords

DOC = Path(__file__).resolve().parent.parent / "docs" / "streaming.md"
HEADING = "## Every `StreamingDataset` keyword of mosaicml-streaming 0.13"
STATUSES = {"honoured", "honoured differently", "refused"}


def keyword_table() -> dict[str, str]:
    """{keyword: status} from the table under ``HEADING`` (rows ``| `name` (default) | status | ... |``).
    Raises AssertionError when the section or a row's shape is missing."""
    text = DOC.read_text()
    assert HEADING in text, f"{DOC.name} lost its section {HEADING!r}"
    section = text.split(HEADING, 1)[1].split("\n## ", 1)[0]
    rows = {}
    for line in section.splitlines():
        m = re.match(r"\| `(\w+)` \(([^)]*)\) \| ([a-z ]+) \| (.+) \|$", line)
        if m:
            assert m.group(1) not in rows, f"keyword {m.group(1)} has two rows"
            assert m.group(4).strip(), f"keyword {m.group(1)}: the row says nothing"
            rows[m.group(1)] = m.group(3).strip()
    return rows


@pytest.mark.contract("streaming.keywords")
def test_every_keyword_of_the_installed_streaming_dataset_is_in_the_docs_table():
    streaming = pytest.importorskip("streaming")
    from zephon_streaming import StreamingDataset

    table = keyword_table()
    host = host_keywords(streaming.StreamingDataset.__init__)
    missing = sorted(set(host) - set(table))
    assert not missing, (f"docs/streaming.md's keyword table lacks keywords of streaming {streaming.__version__}'s "
                         f"StreamingDataset: {missing}; add a row each (honoured / honoured differently / refused)")
    bad = {k: v for k, v in table.items() if v not in STATUSES}
    assert not bad, f"statuses must be one of {sorted(STATUSES)}: {bad}"
    ours = host_keywords(StreamingDataset.__init__)
    assert not set(table) - set(ours), f"rows for keywords zephon_streaming does not take: {set(table) - set(ours)}"
