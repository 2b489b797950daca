"""zephon_energon.get_train_dataset on a path that is not there: the error says what was looked for (a file for
a ``.jsonl`` or ``.yaml`` path, a directory for a dataset), naming the path."""
from __future__ import annotations

import pytest

pytest.importorskip("megatron.energon")

import zephon_energon as ze  # noqa: E402
from test_energon_adapter import wc  # noqa: E402
from zephon.formats import DataError  # noqa: E402


@pytest.mark.parametrize("name,want", [("nope.jsonl", "no such file"), ("meta.yaml", "no such file"),
                                       ("dataset", "no such directory")])
def test_a_missing_path_is_named_as_a_file_or_a_directory(tmp_path, name, want):
    path = tmp_path / name
    with pytest.raises(DataError, match=want) as ei:
        ze.get_train_dataset(str(path), worker_config=wc(), batch_size=1, shuffle_buffer_size=None,
                             max_samples_per_sequence=None)
    msg = str(ei.value)
    assert str(path) in msg
    if want == "no such file":
        assert "directory" not in msg.replace(str(tmp_path), ""), msg
