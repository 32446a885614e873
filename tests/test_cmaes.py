"""sep-CMA-ES (trainers.cmaes): the update against `cmaes.SepCMA` on identical samples, and
an end-to-end run on `tiny` (kill-and-resume and fork equality)."""

from __future__ import annotations

import json

import numpy as np
import pytest
from cmaes import SepCMA

from seedledger.engine.config import Schedules
from seedledger.ledger import Ledger
from seedledger.replay.noise import round_coefficient
from seedledger.trainers.adaptation import Hyperparameters
from seedledger.trainers.cmaes import CMAES, CMAESSpec, recombination_weights
from seedledger.trainers.member import Member
from seedledger.trainers.optim import OptimizerSpec
from seedledger.trainers.policy_base import State
from seedledger.trainers.shaping import ranking
from tests.test_ga import _cli, _config, _fingerprints


@pytest.mark.parametrize("mirrored", [False, True])
def test_mean_update_matches_sepcma_on_identical_samples(mirrored):
    rng = np.random.default_rng(0)
    d, lam, sigma = 50, 8, round_coefficient(0.3)
    mean = rng.normal(size=d)
    keys = rng.normal(size=(lam // 2 if mirrored else lam, d))  # stand-ins for ε(key)
    policy = CMAES(lam, CMAESSpec(), mirrored=mirrored, hyperparameters=Hyperparameters(1.0, sigma, Schedules(), 1))
    state = policy.start()
    _, s, _ = policy.hyperparameters(state, 1)
    members, state = policy.ask(state, run_key=1, generation=1, sigma=s)
    z = np.array([m.sign * keys[m.index // 2 if mirrored else m.index] for m in members])
    rewards = [float(-np.sum((mean + sigma * zi) ** 2)) for zi in z]
    rewards[3] = rewards[5]  # a tie: broken by member index, as SepCMA's stable sort does
    coefs = policy.tell(state, members, rewards, lr=1.0, sigma=s, optimizer=OptimizerSpec()).coefficients
    ours = mean.copy()
    for m, c in zip(members, coefs, strict=True):
        ours += c * keys[m.index // 2 if mirrored else m.index]

    oracle = SepCMA(mean=mean.copy(), sigma=sigma, population_size=lam)
    oracle.tell([(mean + sigma * zi, -r) for zi, r in zip(z, rewards, strict=True)])
    assert np.allclose(oracle._weights, recombination_weights(lam))
    # coefficients are rounded to 12 significant bits: agreement to that precision
    assert np.allclose(ours, oracle.mean, rtol=0, atol=sigma * 2.0**-11 * 2)
    assert np.abs(ours - mean).max() > 1e-2  # the mean did move


def test_at_adapter_scale_sepcma_leaves_sigma_and_diagonal_alone():
    """Why D = 1 and σ from the config: at d = 10⁵ one SepCMA step moves σ and D by < 1e-4."""
    rng = np.random.default_rng(1)
    d, lam = 100_000, 8
    oracle = SepCMA(mean=np.zeros(d), sigma=0.01, population_size=lam)
    xs = [oracle.ask() for _ in range(lam)]
    oracle.tell([(x, float(np.sum(x[:10]))) for x in xs])
    assert abs(oracle._sigma / 0.01 - 1) < 1e-4
    assert np.abs(np.sqrt(oracle._C) - 1).max() < 1e-4
    del rng


def test_ranking_breaks_ties_by_index():
    assert ranking([1.0, 2.0, 2.0, 0.0]) == [1, 2, 0, 3]
    members, _ = CMAES(4, CMAESSpec()).ask(State(), 5, 1, sigma=0.5)
    assert members == [Member(i, members[i].key, 1) for i in range(4)]


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("cmaes")
    ledger_path = tmp / "ref.db"
    _cli("train", str(_config(tmp, algorithm="cmaes", mirrored=True)), "--run", "ref", "--ledger", str(ledger_path))
    return ledger_path, _fingerprints(ledger_path, "ref")


def test_run_records_and_verifies(reference):
    ledger_path, fps = reference
    assert len(set(fps)) == 3
    with Ledger.open(str(ledger_path)) as led:
        rec = led.generation("ref", 2)
        assert rec.lr == 1.0 and rec.extra["cmaes"]["mu"] == 2
        assert sorted(rec.extra["cmaes"]["ranking"]) == [0, 1, 2, 3]
    assert json.loads(_cli("verify", "ref", "--ledger", str(ledger_path), "--json").stdout)["ok"]


