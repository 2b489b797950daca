"""Seeded bijective index permutations over ``[0, n)``, computable element by element.

Random access is the point: position ``i`` of a shuffled order is ``perm(i)`` with no table, so a
chunk of any lane can be regenerated from ``(lane, chunk_id)`` and checkpoints never store orders.
Construction: a 4-round balanced Feistel network over the smallest even bit width covering ``n``,
with cycle walking (re-apply while the value is ``>= n``); the round function is the splitmix64
finaliser. Vectorised with numpy (uint64, wrap-around arithmetic). Up to ``TABLE_MAX`` elements a
Feistel network over so few bits reaches few permutations (identity up to 28x too often at n = 8), so
small ``n`` use a Fisher-Yates table driven by the same hash instead.
"""
from __future__ import annotations

import hashlib
import json

import numpy as np

_ROUNDS = 4
TABLE_MAX = 64
_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)


def derive_key(*parts) -> int:
    """A 64-bit key from JSON-able ``parts`` (seed, names, indices), stable across runs and Pythons.

    Uses BLAKE2b of the canonical JSON, never ``hash()`` (salted per process)."""
    blob = json.dumps(parts, separators=(",", ":"), sort_keys=True, default=str).encode()
    return int.from_bytes(hashlib.blake2b(blob, digest_size=8).digest(), "little")


def mix64(x: np.ndarray) -> np.ndarray:
    """splitmix64 finaliser on a uint64 array (a good 64-bit bijective hash)."""
    x = np.asarray(x, dtype=np.uint64)
    with np.errstate(over="ignore"):
        x = x ^ (x >> np.uint64(30))
        x = x * _M1
        x = x ^ (x >> np.uint64(27))
        x = x * _M2
        x = x ^ (x >> np.uint64(31))
    return x


class IndexPermutation:
    """A bijection of ``[0, n)`` chosen by ``key``.

    ``perm(idx)`` maps an int or an int array of positions to permuted indices (same shape, int64).
    Raises ``IndexError`` for positions outside ``[0, n)``.
    """

    __slots__ = ("n", "key", "_half", "_mask", "_round_keys", "_table")

    def __init__(self, n: int, key: int):
        if n < 0:
            raise ValueError(f"permutation size must be >= 0, got {n}")
        self.n = int(n)
        self.key = int(key) & 0xFFFFFFFFFFFFFFFF
        bits = max(2, int(self.n - 1).bit_length() if self.n > 1 else 2)
        bits += bits & 1  # balanced halves
        self._half = np.uint64(bits // 2)
        self._mask = np.uint64((1 << (bits // 2)) - 1)
        self._round_keys = [mix64(np.array([(self.key + r + 1) & 0xFFFFFFFFFFFFFFFF], dtype=np.uint64))[0]
                            for r in range(_ROUNDS)]
        self._table = None
        if 1 < self.n <= TABLE_MAX:  # Fisher-Yates: swap i with a hash-chosen j <= i, from the top down
            base = self.key ^ 0x9E3779B97F4A7C15
            draws = mix64(np.array([(base + i) & 0xFFFFFFFFFFFFFFFF for i in range(self.n)], dtype=np.uint64))
            table = list(range(self.n))
            for i in range(self.n - 1, 0, -1):
                j = int(draws[i] % np.uint64(i + 1))
                table[i], table[j] = table[j], table[i]
            self._table = np.array(table, dtype=np.int64)

    def _feistel(self, x: np.ndarray) -> np.ndarray:
        left = x >> self._half
        right = x & self._mask
        for rk in self._round_keys:
            left, right = right, left ^ (mix64(right ^ rk) & self._mask)
        return (left << self._half) | right

    def __call__(self, idx):
        scalar = np.isscalar(idx)
        a = np.atleast_1d(np.asarray(idx, dtype=np.int64))
        if a.size and (a.min() < 0 or a.max() >= self.n):
            raise IndexError(f"position out of range [0, {self.n})")
        if self.n <= 1:
            out = a.copy()
        elif self._table is not None:
            out = self._table[a]
        else:
            x = a.astype(np.uint64)
            x = self._feistel(x)
            n = np.uint64(self.n)
            out_of_range = x >= n
            while out_of_range.any():  # cycle walking keeps it a bijection of [0, n)
                x[out_of_range] = self._feistel(x[out_of_range])
                out_of_range = x >= n
            out = x.astype(np.int64)
        return int(out[0]) if scalar else out
