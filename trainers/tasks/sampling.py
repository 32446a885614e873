"""Deterministic splits and mini-batches: pure functions of integers (splitmix64).

No ``random`` module and no hash randomization, so the same (seed, generation) picks the
same rows on every Python version and machine — a requirement for replay and resume.
"""

from __future__ import annotations

from functools import lru_cache
from typing import TypeVar

from seedledger.ledger.errors import SeedLedgerError
from seedledger.replay.hashing import GOLDEN, MASK64, splitmix64

T = TypeVar("T")


def mix64(*values: int) -> int:
    """Combine integers into one 64-bit value: one splitmix64 step per value."""
    h = GOLDEN
    for v in values:
        h = splitmix64(h ^ (v & MASK64))
    return h


def uniform(*values: int) -> float:
    """A float in [0, 1) from the mix of ``values`` (53 bits)."""
    return (mix64(*values) >> 11) / float(1 << 53)


@lru_cache(maxsize=64)
def permutation(n: int, *key: int) -> tuple[int, ...]:
    """A permutation of ``range(n)`` determined by ``key``."""
    return tuple(sorted(range(n), key=lambda i: (mix64(*key, i), i)))


def split_indices(n: int, test_size: int, seed: int) -> tuple[list[int], list[int]]:
    """(train, test) index lists: the first ``test_size`` of a seeded permutation are test."""
    order = permutation(n, seed, 0x5B1D)
    test = sorted(order[:test_size])
    train = sorted(order[test_size:])
    return train, test


def split_rows(
    rows: list[T], test_rows: list[T] | None, test_size: int, seed: int, source: object
) -> tuple[list[T], list[T]]:
    """(train, test): all of ``rows`` and ``test_rows`` when a test file is given, else a
    seeded split of ``rows`` with ``test_size`` test rows."""
    if test_rows is not None:
        return rows, test_rows
    if not 0 < test_size < len(rows):
        raise SeedLedgerError(
            f"{source}: cannot split {len(rows)} rows into train and test (test_size {test_size})"
        )
    train, test = split_indices(len(rows), test_size, seed)
    return [rows[i] for i in train], [rows[i] for i in test]


def stream(n: int, seed: int, start: int, count: int) -> list[int]:
    """Positions ``start … start+count`` of an endless stream of fresh permutations of
    ``range(n)`` (one per epoch), so consecutive batches cover the data without repeats."""
    out: list[int] = []
    pos = start
    while len(out) < count:
        epoch, offset = divmod(pos, n)
        order = permutation(n, seed, 0xBA7C, epoch)
        take = min(count - len(out), n - offset)
        out.extend(order[offset : offset + take])
        pos += take
    return out


class Rng:
    """A tiny counter-based generator over ``mix64`` for the data generators (portable)."""

    def __init__(self, *key: int) -> None:
        self._key = mix64(*key)
        self._n = 0

    def below(self, n: int) -> int:
        """An integer in ``[0, n)``."""
        self._n += 1
        return mix64(self._key, self._n) % n

    def randint(self, lo: int, hi: int) -> int:
        """An integer in ``[lo, hi]``."""
        return lo + self.below(hi - lo + 1)

    def choice(self, seq):  # noqa: ANN001, ANN201 - any sequence
        return seq[self.below(len(seq))]
