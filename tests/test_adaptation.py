"""σ/lr adaptation inside a run: the rule, its records, and resume/fork after SIGKILL."""

from __future__ import annotations

import math
import os
import signal
from pathlib import Path

import pytest

from seedledger.engine.config import validate
from seedledger.ledger import GenerationRecord, Ledger, MemberRecord
from seedledger.ledger.errors import SeedLedgerError
from seedledger.replay.noise import round_coefficient
from seedledger.trainers.adaptation import Hyperparameters, SigmaAdaptation, next_sigma, odd_share
from seedledger.trainers.policy import make_policy
from tests.support.configs import tiny_config
from tests.support.runs import cli as seedledger

ROOT = Path(__file__).resolve().parents[1]
ADAPT = {"sigma": {"rate": 0.5, "target": 0.5}, "lr": "follow_sigma"}


def test_odd_share_splits_mirrored_rewards_into_first_and_second_order_parts():
    assert odd_share([1.0, 0.0, 0.6, 0.6]) == pytest.approx(0.25 / 0.255)
    assert odd_share([0.3, -0.3, -0.2, 0.2]) == 1.0  # purely antisymmetric: linear
    assert odd_share([0.5, 0.5, 0.1, 0.1]) == 0.0  # purely symmetric: curvature
    assert odd_share([0.2] * 6) is None  # all tie: no information


def test_next_sigma_grows_when_linear_shrinks_when_even_and_stays_in_bounds():
    spec = SigmaAdaptation(rate=0.2, target=0.5, min=1e-4, max=2e-3)
    assert next_sigma(spec, 1e-3, [0.3, -0.3, -0.2, 0.2]) == pytest.approx(1e-3 * math.exp(0.2))
    assert next_sigma(spec, 1e-3, [0.5, 0.5, 0.1, 0.1]) == pytest.approx(1e-3 * math.exp(-0.2))
    assert next_sigma(spec, 1e-3, [0.2] * 4) == 1e-3
    assert next_sigma(spec, 1.9e-3, [0.3, -0.3, -0.2, 0.2]) == 2e-3
    assert next_sigma(spec, 1.1e-4, [0.5, 0.5, 0.1, 0.1]) == 1e-4


def _record(index: int, extra: dict, rewards: list[float]) -> GenerationRecord:
    members = [MemberRecord(i, 1, 1 - 2 * (i % 2), r, 0.0, {}) for i, r in enumerate(rewards)]
    return GenerationRecord(index, 0.0, 0.0, len(members), {}, index, [], members, None, extra=extra)


def test_state_is_a_function_of_the_last_record_and_restarts_on_new_base_values():
    cfg = validate({"population": 4, "adaptation": ADAPT})
    policy = make_policy(cfg)
    state = policy.restore([])
    lr, sigma, extra = policy.hyperparameters(state, 1)
    assert (lr, sigma) == (cfg.lr, round_coefficient(cfg.sigma))
    assert extra["adaptation"]["base"] == {"lr": cfg.lr, "sigma": cfg.sigma}
    history = []
    for g in range(1, 5):
        lr, sigma, extra = policy.hyperparameters(state, g)
        history.append(_record(g, extra, [0.3, -0.3, 0.1, 0.05]))
        state = policy.observe(state, history[-1])
    fresh = make_policy(cfg)
    restored = fresh.restore(history)  # what resume does
    assert restored == state and fresh.hyperparameters(restored, 5) == policy.hyperparameters(state, 5)
    lr5, sigma5, _ = policy.hyperparameters(state, 5)
    assert sigma5 > cfg.sigma and lr5 / sigma5 == pytest.approx(cfg.lr / cfg.sigma, rel=1e-3)
    forked = make_policy(cfg.model_copy(update={"sigma": 2e-3}))
    # a fork with another σ adapts afresh from its own value
    assert forked.hyperparameters(forked.restore(history), 5)[1] == round_coefficient(2e-3)
    plain = Hyperparameters(cfg.lr, cfg.sigma, cfg.schedule, cfg.generations)
    # no adaptation: nothing recorded; the schedule's σ is unrounded (the policy rounds it, once)
    assert plain.at(plain.observe(plain.start(), history[-1]), 5) == (cfg.lr, cfg.sigma, {})


def test_config_refuses_sigma_adaptation_without_pairs():
    with pytest.raises(SeedLedgerError, match="adaptation.sigma: needs mirrored pairs"):
        validate({"population": 2, "adaptation": {"sigma": {}}})
    with pytest.raises(SeedLedgerError, match="min"):
        validate({"population": 4, "adaptation": {"sigma": {"min": 1.0, "max": 0.1}}})



@pytest.fixture(scope="module")
def adapted(tmp_path_factory):
    """One uninterrupted 3-generation run with σ adaptation, and one killed after its
    second commit and resumed, in one ledger."""
    tmp = tmp_path_factory.mktemp("adapt")
    config = tmp / "adapt.yaml"
    config.write_text(tiny_config(generations=3, adaptation=ADAPT, sigma=0.02, lr=0.01))
    db = str(tmp / "l.db")
    seedledger("train", str(config), "--run", "whole", "--ledger", db)
    env = os.environ | {"SEEDLEDGER_FAILPOINT": "committed@2"}
    killed = seedledger("train", str(config), "--run", "killed", "--ledger", db, env=env, check=False)
    assert killed.returncode == -signal.SIGKILL
    seedledger("resume", "killed", "--ledger", db)
    return config, db


@pytest.mark.slow
def test_adapted_values_are_recorded_and_a_killed_run_resumes_to_the_same_bits(adapted):
    _, db = adapted
    with Ledger.open(db, create=False) as led:
        whole, killed = led.records("whole"), led.records("killed")
    assert [r.fingerprint for r in killed] == [r.fingerprint for r in whole]
    assert [(r.lr, r.sigma, r.extra) for r in killed] == [(r.lr, r.sigma, r.extra) for r in whole]
    sigmas = [r.sigma for r in whole]
    assert len(set(sigmas)) > 1, sigmas  # σ really moved
    for r in whole:  # lr follows σ; what replay uses is the record's own fields
        assert r.optimizer["lr"] == r.lr
        assert r.lr / r.extra["adaptation"]["sigma"] == pytest.approx(0.01 / 0.02)
    seedledger("verify", "killed", "--ledger", db)  # exit 0: every fingerprint replays


def test_a_fork_continues_the_adaptation_unless_it_sets_new_values(adapted):
    _, db = adapted
    seedledger("fork", "whole@2", "--run", "same", "--generations", "1", "--ledger", db)
    seedledger("fork", "whole@2", "--run", "reset", "--set", "sigma=0.03", "--generations", "1", "--ledger", db)
    with Ledger.open(db, create=False) as led:
        whole, same, reset = led.records("whole"), led.records("same"), led.records("reset")
    assert [r.fingerprint for r in same] == [r.fingerprint for r in whole]
    assert reset[2].sigma == round_coefficient(0.03) and reset[2].extra["adaptation"]["base"]["sigma"] == 0.03
