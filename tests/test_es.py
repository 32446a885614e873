"""The ES policy: member keys, reward shaping and the coefficients it hands to replay."""

import struct
from types import SimpleNamespace

import pytest

from seedledger.ledger.errors import SeedLedgerError
from seedledger.replay.noise import member_key, round_coefficient
from seedledger.trainers.es import ES
from seedledger.trainers.optim import OptimizerSpec
from seedledger.trainers.policy import Policy, make_policy
from seedledger.trainers.policy_base import State
from seedledger.trainers.shaping import centered_ranks, zscore

SGD, MOMENTUM, ADAM = OptimizerSpec(), OptimizerSpec(name="momentum"), OptimizerSpec(name="adam")
NONE, SIGMA = State(), 1e-3  # an ES without a schedule carries nothing; only `difference` reads σ


def asked(policy, run_key: int, generation: int) -> list:
    """The members `policy` asks for at a fresh State."""
    return policy.ask(policy.start(), run_key, generation, sigma=SIGMA)[0]


def test_ask_is_deterministic_and_mirrored_pairs_share_a_key():
    es = ES(8, mirrored=True)
    a, b = asked(es, 123, 5), asked(es, 123, 5)
    assert a == b
    assert [m.sign for m in a] == [1, -1] * 4
    assert all(a[i].key == a[i + 1].key for i in range(0, 8, 2))
    assert len({m.key for m in a}) == 4
    assert a[0].key == member_key(123, 5, 0)
    assert asked(es, 123, 6)[0].key != a[0].key
    assert asked(es, 124, 5)[0].key != a[0].key


def test_unmirrored_members_have_distinct_keys():
    members = asked(ES(6, mirrored=False), 7, 1)
    assert len({m.key for m in members}) == 6
    assert all(m.sign == 1 for m in members)


def test_odd_mirrored_population_is_refused():
    with pytest.raises(ValueError, match="even"):
        ES(5, mirrored=True)


def test_zscore_and_ranks():
    z = zscore([1.0, 2.0, 3.0, 4.0])
    assert abs(sum(z)) < 1e-12
    assert abs(sum(v * v for v in z) / 4 - 1.0) < 1e-12
    assert zscore([0.5] * 6) == [0.0] * 6
    assert centered_ranks([10.0, -1.0, 3.0]) == [0.5, -0.5, 0.0]
    assert centered_ranks([1.0, 1.0, 2.0, 0.0]) == [0.0, 0.0, 0.5, -0.5]


def test_tell_rounds_every_coefficient_and_folds_pairs():
    es = ES(4, mirrored=True)
    members = asked(es, 1, 1)
    coeffs = es.tell(NONE, members, [1.0, 0.0, 0.2, 0.7], lr=5e-4, sigma=SIGMA, optimizer=SGD).coefficients
    z = zscore([1.0, 0.0, 0.2, 0.7])
    assert coeffs[1] == 0.0 and coeffs[3] == 0.0
    assert coeffs[0] == round_coefficient(5e-4 / 4 * (z[0] - z[1]))
    assert coeffs[2] < 0  # the negative-noise member won: step towards −ε
    for c in coeffs:
        assert c == round_coefficient(c)  # already on the 12-bit grid
        mantissa = struct.unpack("<Q", struct.pack("<d", c))[0] & ((1 << 52) - 1)
        assert mantissa & ((1 << 41) - 1) == 0  # at most 12 significant bits


def test_tell_without_signal_gives_a_zero_update():
    es = ES(6, mirrored=False)
    assert es.tell(NONE, asked(es, 3, 2), [0.25] * 6, lr=1.0, sigma=SIGMA, optimizer=SGD).coefficients == [0.0] * 6


def test_tell_checks_lengths():
    es = ES(2, mirrored=False)
    with pytest.raises(ValueError):
        es.tell(NONE, asked(es, 1, 1), [1.0], lr=1.0, sigma=SIGMA, optimizer=SGD)


def test_sgd_folds_the_learning_rate_and_momentum_and_adam_do_not():
    """SGD's coefficients are α·z/N (θ += Σ cε); momentum's and Adam's are z/N (the rule
    applies α). The scale is the policy's business, not the loop's."""
    es = ES(6, mirrored=False)
    members, rewards = asked(es, 5, 3), [0.1, 0.9, 0.4, 0.3, 0.8, 0.0]
    z = zscore(rewards)
    assert es.tell(NONE, members, rewards, lr=0.25, sigma=SIGMA, optimizer=SGD).coefficients == [
        round_coefficient(0.25 / 6 * zi) for zi in z
    ]
    for rule in (MOMENTUM, ADAM):
        assert es.tell(NONE, members, rewards, lr=0.25, sigma=SIGMA, optimizer=rule).coefficients == [
            round_coefficient(1.0 / 6 * zi) for zi in z
        ]


def cfg(**changes) -> SimpleNamespace:
    return SimpleNamespace(**({"population": 4, "mirrored": True, "shaping": "zscore"} | changes))


def test_make_policy_builds_es_from_the_config():
    policy = make_policy(cfg(shaping="centered_rank"))
    assert isinstance(policy, ES) and isinstance(policy, Policy)
    assert (policy.population, policy.mirrored, policy.shaping) == (4, True, "centered_rank")
    assert asked(policy, 9, 2) == asked(ES(4), 9, 2)
    assert isinstance(make_policy(cfg(algorithm="es")), ES)


def test_make_policy_refuses_an_unknown_algorithm():
    with pytest.raises(SeedLedgerError, match="unknown algorithm 'cma-es'"):
        make_policy(cfg(algorithm="cma-es"))


def test_make_policy_reads_the_engine_config():
    from seedledger.engine.config import validate

    policy = make_policy(validate({"population": 6, "mirrored": False}))
    assert (policy.population, policy.mirrored, policy.shaping) == (6, False, "zscore")
