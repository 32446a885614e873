"""shaping: pareto — NSGA-II fronts and crowding over the reward components, mapped to
centered ranks; order-independent, deterministic, recorded as pareto_front."""

from __future__ import annotations

import math
import random

import pytest

from seedledger.engine.config import validate
from seedledger.ledger.errors import SeedLedgerError
from seedledger.trainers.es import ES
from seedledger.trainers.optim import OptimizerSpec
from seedledger.trainers.shaping import centered_ranks, crowding, fronts, objective_vectors, pareto_shape


def test_fronts_of_a_known_set():
    pts = [(1, 5), (2, 4), (3, 3), (2, 2), (1, 1), (3, 3), (0, 6)]
    assert fronts(pts) == [0, 0, 0, 1, 2, 0, 0]
    assert fronts([(1.0,), (1.0,)]) == [0, 0]


def test_crowding_ends_are_infinite_and_duplicates_share():
    pts = [(0.0, 4.0), (1.0, 3.0), (3.0, 1.0), (4.0, 0.0), (1.0, 3.0)]
    d = crowding(pts, fronts(pts))
    assert d[0] == d[3] == math.inf
    assert d[1] == d[4] == pytest.approx((3 - 0) / 4 + (4 - 1) / 4)
    assert d[2] == pytest.approx((4 - 1) / 4 + (3 - 0) / 4)


def test_shaped_values_rank_front_then_crowding():
    pts = [(0.0, 4.0), (1.0, 3.0), (2.5, 1.0), (4.0, 0.0), (0.5, 0.5)]
    shaped, front = pareto_shape(pts)
    assert front == [0, 0, 0, 0, 1]
    assert shaped[4] == -0.5  # the dominated member is last
    assert shaped[0] == shaped[3] == max(shaped)  # the ends (infinite crowding) share the top
    # crowding of (1, 3): (2.5 - 0)/4 + (4 - 1)/4 = 1.375; of (2.5, 1): (4 - 1)/4 + (3 - 0)/4 = 1.5
    assert shaped[1] < shaped[2]


def test_one_objective_is_centered_rank():
    rewards = [0.3, 0.1, 0.3, 0.9, -2.0, 0.1]
    shaped, _ = pareto_shape([(r,) for r in rewards])
    assert shaped == centered_ranks(rewards)


def test_member_order_does_not_matter():
    rng = random.Random(5)
    pts = [(rng.choice([0.0, 0.5, 1.0]), rng.choice([-1.0, -0.5, 0.0]), rng.random()) for _ in range(16)]
    shaped, front = pareto_shape(pts)
    order = list(range(16))
    rng.shuffle(order)
    shaped2, front2 = pareto_shape([pts[i] for i in order])
    assert [shaped2[order.index(i)] for i in range(16)] == shaped
    assert [front2[order.index(i)] for i in range(16)] == front


def test_objectives_use_weight_signs_and_skip_zero_weights():
    comps = [{"tests": 1.0, "length": 10.0, "timeouts": 0.0}, {"tests": 1.0, "length": 20.0, "timeouts": 1.0},
             {"tests": None, "length": 0.0, "timeouts": 0.0}]
    vecs = objective_vectors(comps, {"tests": 1.0, "length": -0.5, "timeouts": 0.0})
    assert vecs == [(1.0, -5.0), (1.0, -10.0), (-math.inf, -0.0)]
    assert fronts(vecs) == [0, 1, 0]


def test_es_tell_records_the_front_and_is_deterministic():
    es = ES(4, mirrored=True, shaping="pareto")
    members, state = es.ask(es.start(), 7, 1, sigma=0.5)
    comps = [{"a": 1.0, "b": 0.0}, {"a": 0.0, "b": 1.0}, {"a": 0.0, "b": 0.0}, {"a": 1.0, "b": 1.0}]
    sgd = OptimizerSpec()
    coeffs = es.tell(state, members, [1.0, 1.0, 0.0, 2.0], lr=0.5, sigma=0.5, optimizer=sgd, components=comps,
                     objectives={"a": 1.0, "b": 1.0}).coefficients
    assert [c["pareto_front"] for c in comps] == [1.0, 1.0, 2.0, 0.0]
    again = [dict(c) for c in comps]
    assert es.tell(state, members, [1.0, 1.0, 0.0, 2.0], lr=0.5, sigma=0.5, optimizer=sgd, components=again,
                   objectives={"a": 1.0, "b": 1.0}).coefficients == coeffs
    assert coeffs[1] == coeffs[3] == 0.0 and coeffs[2] < 0  # pair 2: (0,0) below (1,1)
    with pytest.raises(ValueError, match="components"):
        es.tell(state, members, [1.0] * 4, lr=0.5, sigma=0.5, optimizer=sgd)


def test_config_accepts_pareto_and_refuses_unknown_shapings():
    assert validate({"shaping": "pareto"}).shaping == "pareto"
    with pytest.raises(SeedLedgerError, match="shaping"):
        validate({"shaping": "nsga"})
