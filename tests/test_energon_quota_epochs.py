"""zephon_energon, fractional ``blend_epochized`` repetitions with ``repeat=False``: consecutive iterations of a
loader continue the datasets' shuffled passes (r = 0.5: two iterations read the dataset once whole), as
docs/energon.md says and as megatron.energon's savable loader does.

Oracles: the samples written by the test fixture (16 text, 24 other) and megatron.energon's own loaders on the
same metadataset.
"""
from __future__ import annotations

from collections import Counter

import pytest

pytest.importorskip("megatron.energon")

from megatron import energon as me  # noqa: E402

import zephon_energon as ze  # noqa: E402
from test_energon_adapter import wc  # noqa: E402
from test_energon_features import _frac_yaml  # noqa: E402
from test_energon_subset import data  # noqa: E402,F401  (the module fixture)


def _iterations(mod, path, savable: bool, n: int = 2) -> list[Counter]:
    ds = mod.get_train_dataset(path, worker_config=wc(), batch_size=None, shuffle_buffer_size=None,
                               max_samples_per_sequence=None, repeat=False)
    loader = mod.get_savable_loader(ds) if savable else mod.get_loader(ds)
    return [Counter(s.__key__ for s in loader) for _ in range(n)]


def _other(c: Counter) -> Counter:
    return Counter({k: v for k, v in c.items() if k.startswith("u")})


@pytest.mark.parametrize("savable", [True, False])
def test_fractional_epochs_continue_the_pass(data, tmp_path, savable):  # noqa: F811
    path = _frac_yaml(data, tmp_path, 0.5)
    ours = _iterations(ze, path, savable)
    for c in ours:
        assert sum(c.values()) == 16 + 12, "each iteration: text once, half of other"
    both = _other(ours[0]) + _other(ours[1])
    assert both == Counter({k: 1 for k in both}) and len(both) == 24, "two r=0.5 iterations: other read once whole"
    if savable:  # Energon's savable loader continues its iterator too
        theirs = _iterations(me, path, True)
        assert [sum(c.values()) for c in theirs] == [sum(c.values()) for c in ours]
        assert len(_other(theirs[0]) + _other(theirs[1])) == 24


def test_a_state_saved_in_the_second_pass_restores_there(data, tmp_path):  # noqa: F811
    path = _frac_yaml(data, tmp_path, 0.5)

    def loader():
        return ze.get_savable_loader(ze.get_train_dataset(path, worker_config=wc(), batch_size=None,
                                                          shuffle_buffer_size=None, max_samples_per_sequence=None,
                                                          repeat=False))
    whole = _iterations(ze, path, True)
    first = loader()
    assert Counter(s.__key__ for s in first) == whole[0]
    it = iter(first)
    head = [next(it).__key__ for _ in range(5)]
    state = first.save_state_rank()
    again = loader()
    again.restore_state_rank(state)
    assert Counter(head + [s.__key__ for s in again]) == whole[1], "the second pass, continued"
