"""Row metadata is declared once (zephon.formats.records) and sample identities read by field."""
import json
import re
from pathlib import Path

import pytest

from zephon.formats import records
from zephon.formats.records import PieceRef, Src, first_piece, piece_ref, src_of

ROOT = Path(__file__).resolve().parents[1]
# Python's own dunders, and names Energon itself defines (sample fields, metadataset keys)
PYTHON_DUNDERS = {"__main__", "__mp_main__", "__name__", "__init__", "__class__", "__version__", "__func__", "__file__",
                  "__spec__", "__len__",
                  "__subflavors__", "__sources__", "__function__", "__dict__", "__module__", "__qualname__", "__doc__",
                  "__all__"}


def test_every_reserved_key_in_code_is_declared():
    declared = {v for k, v in vars(records).items() if k.isupper() and isinstance(v, str)}
    used = set()
    for path in list((ROOT / "zephon").rglob("*.py")) + list((ROOT / "adapters").rglob("*.py")):
        used |= set(re.findall(r"""["'](__[a-z_]+__)["']""", path.read_text()))
    undeclared = used - declared - PYTHON_DUNDERS
    assert not undeclared, f"reserved keys used but not declared in zephon/formats/records.py: {sorted(undeclared)}"
    assert "__src__" in declared and "__state__" in declared


def test_identities_serialize_as_plain_json_lists():
    assert json.loads(json.dumps({"__src__": Src(1, 2, 3, 40)})) == {"__src__": [1, 2, 3, 40]}
    assert json.loads(json.dumps([PieceRef(7, 1)])) == [[7, 1]]


def test_identities_read_by_field_from_tuples_and_lists():
    assert src_of({"__src__": (1, 2, 3, 40)}).shard == 2
    assert piece_ref({"__src__": Src(1, 2, 3, 40), "__piece__": 2}) == (40, 2)
    assert first_piece({"__src__": [[9, 0], [11, 3]]}) == PieceRef(9, 0)
    assert first_piece({"__src__": []}) == PieceRef(-1, 0)
    with pytest.raises(TypeError, match="combined row"):
        src_of({"__src__": [[9, 0]]})
