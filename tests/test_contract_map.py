"""The compatibility matrix's map: every contract tag names a row of compat_matrix/contracts.py and every
row is proven by at least one test (tags read statically by compat_matrix.tagmap)."""
from __future__ import annotations

from compat_matrix.contracts import BY_ID, CONTRACTS
from compat_matrix.tagmap import collect_tags


def test_every_contract_tag_names_a_row():
    tags, problems = collect_tags()
    bad = [f"{where}: unknown row {i!r}" for where, ids in sorted(tags.items()) for i in ids if i not in BY_ID]
    assert not problems + bad, "contract tags that name no row of compat_matrix/contracts.py:\n" + "\n".join(
        problems + bad)


def test_every_contract_row_is_proven_by_a_test():
    tags, _ = collect_tags()
    proven = {i for ids in tags.values() for i in ids}
    unproven = [f"{c.id}: {c.title}" for c in CONTRACTS if c.id not in proven]
    assert not unproven, "rows of compat_matrix/contracts.py without a @pytest.mark.contract test:\n" + "\n".join(
        unproven)
