"""Schedules give the value in force per generation; the ledger records it."""

import pytest

from seedledger.trainers.schedules import Schedule


def test_constant_and_warmup():
    assert Schedule().factor(7, 10) == 1.0
    warm = Schedule(name="linear_warmup", warmup=4)
    assert [warm.factor(g, 10) for g in (1, 2, 4, 5, 9)] == [0.25, 0.5, 1.0, 1.0, 1.0]


def test_cosine_decays_to_final_ratio():
    cos = Schedule(name="cosine", warmup=2, final_ratio=0.1)
    assert cos.factor(1, 12) == 0.5
    assert cos.factor(2, 12) == 1.0
    assert cos.factor(12, 12) == pytest.approx(0.1)
    values = [cos.factor(g, 12) for g in range(2, 13)]
    assert values == sorted(values, reverse=True)


def test_a_bare_name_is_shorthand():
    assert Schedule.model_validate("cosine") == Schedule(name="cosine")
    with pytest.raises(ValueError):
        Schedule.model_validate("exponential")
