"""LM-MA-ES (`trainers/lmmaes.py`) driven through replay's `paths` rule, against pypop7's
LMMAES (a dense float64 implementation of the paper's Algorithm 1) on the same samples and
rankings; replay of the recorded numbers alone reaches the same bits."""

from __future__ import annotations

import copy
import math
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from pypop7.optimizers.es.lmmaes import LMMAES as PypopLMMAES

from seedledger.engine.config import Schedules
from seedledger.ledger import ReplayStep
from seedledger.ledger.errors import SeedLedgerError
from seedledger.replay import paths
from seedledger.replay.fingerprint import fingerprint
from seedledger.replay.noise import generate, run_key, tensor_key
from seedledger.replay.perturbation import Perturbation
from seedledger.replay.rebuild import apply_member
from seedledger.replay.update import OptimizerState, apply_step
from seedledger.trainers.adaptation import Hyperparameters
from seedledger.trainers.lmmaes import LMMAES, LMMAESSpec, Rates, member_rule, transform
from seedledger.trainers.optim import OptimizerSpec

SHAPES = {"a": (12, 10), "b": (40,)}  # n = 160
SGD = OptimizerSpec(name="sgd")


def objective(x: np.ndarray) -> float:
    """A rotated-free ill-conditioned ellipsoid, maximised: −Σ 10^(6i/(n−1))·xᵢ²/n."""
    n = x.size
    return -float(np.sum(10.0 ** (6.0 * np.arange(n) / (n - 1)) * x**2) / n)


def flat(tensors: dict[str, torch.Tensor]) -> np.ndarray:
    return np.concatenate([tensors[n].double().reshape(-1).numpy() for n in SHAPES])


def eps(key: int) -> np.ndarray:
    return np.concatenate([generate(tensor_key(key, n), math.prod(s)).double().numpy() for n, s in SHAPES.items()])


def step_of(g: int, members, coefs, sigma, optimizer) -> ReplayStep:
    return ReplayStep(run="toy", index=g, keys=[m.key for m in members], coefficients=coefs, sigma=sigma,
                      optimizer=optimizer)


class Oracle:
    """pypop7's LMMAES (Loshchilov, Glasmachers & Beyer's Algorithm 1, dense, float64)
    driven on our samples: zᵢ = ε(keyᵢ), its transform for dᵢ, our ranking as fitness."""

    def __init__(self, y: np.ndarray, sigma: float, population: int, m: int):
        n = y.size
        problem = {"fitness_function": lambda x: 0.0, "ndim_problem": n,
                   "lower_boundary": -np.ones(n), "upper_boundary": np.ones(n)}
        options = {"max_function_evaluations": 10**9, "seed_rng": 0, "mean": y.copy(), "sigma": sigma,
                   "n_individuals": population, "n_evolution_paths": m}
        self.es = PypopLMMAES(problem, options)
        _, _, self.y, self.p, self.M, _ = self.es.initialize()
        self.t = 0

    @property
    def sigma(self) -> float:
        return float(self.es.sigma)

    def sample(self, z: np.ndarray) -> np.ndarray:
        """LMMAES.iterate's transform of one z (its _c_d, its paths, min(t, m) of them)."""
        d = z.copy()
        for j in range(min(self.t, self.es.n_evolution_paths)):
            d = (1.0 - self.es._c_d[j]) * d + self.es._c_d[j] * self.M[j] * np.dot(self.M[j], d)
        return d

    def step(self, zs: list[np.ndarray], order: list[int]) -> None:
        z = np.stack(zs)
        d = np.stack([self.sample(x) for x in zs])
        fitness = np.empty(len(zs))
        fitness[order] = np.arange(len(zs))  # minimised: our best first
        self.t += 1
        self.es._n_generations = self.t
        self.y, self.p, self.M = self.es._update_distribution(z, d, self.y, self.p, self.M, fitness)


def run_lmmaes(generations: int, *, population: int = 8, memory: int = 6, sigma: float = 0.25):
    """Train the policy on `objective` through replay; yield per generation what the test checks."""
    torch.manual_seed(0)
    master = {n: torch.full(s, 0.5) for n, s in SHAPES.items()}
    state = OptimizerState()
    hyper = Hyperparameters(1.0, sigma, Schedules(), generations, None)
    policy = LMMAES(population, LMMAESSpec(memory=memory), hyperparameters=hyper)
    policy_state = policy.restore([])
    rk = run_key(7)
    for g in range(1, generations + 1):
        policy_state = policy.attach(policy_state, paths.StateView(master, state, Perturbation().trained))
        lr, sig, _ = policy.hyperparameters(policy_state, g)
        members, policy_state = policy.ask(policy_state, rk, g, sigma=sig)
        rule = {"name": "paths", **member_rule(members), "decay": [0.0] * (memory + 1),
                "gain": [0.0] * (memory + 1), "move": [0.0] * (memory + 1)}
        weights = []
        for m in members:
            x = copy.deepcopy(master)
            apply_member(x, step_of(g, members, [], sig, rule), m.key, m.sign, member=m.index, state=state)
            weights.append(x)
        rewards = [objective(flat(x)) for x in weights]
        decision = policy.tell(policy_state, members, rewards, lr=lr, sigma=sig, optimizer=SGD)
        coefs = decision.coefficients
        start = (copy.deepcopy(master), copy.deepcopy(state))
        step = step_of(g, members, coefs, sig, decision.optimizer)
        apply_step(master, state, step)
        record = SimpleNamespace(sigma=sig, index=g, optimizer=step.optimizer, extra={})
        policy_state = policy.observe(policy_state, record)
        yield SimpleNamespace(start=start, members=members, weights=weights, rewards=rewards, sigma=sig,
                              order=decision.extra["lmmaes"]["ranking"], master=copy.deepcopy(master),
                              state=copy.deepcopy(state),
                              step=step, fingerprint=fingerprint(master))


def test_the_policy_follows_algorithm_1_on_the_same_samples():
    gens = list(run_lmmaes(25))
    first = gens[0]
    oracle = Oracle(flat(first.start[0]), first.sigma, 8, 6)
    for gen in gens:
        # every number the policy records is rounded to 12 significant bits (2⁻¹² ≈ 2.4e-4)
        assert gen.sigma == pytest.approx(oracle.sigma, rel=1e-3)
        zs = [eps(m.key) for m in gen.members]
        for z, x in zip(zs, gen.weights, strict=True):  # members: y + σ·d, d transformed along the paths
            want = oracle.y + oracle.sigma * oracle.sample(z)
            assert np.max(np.abs(flat(x) - want)) < 1e-3 * max(1.0, np.max(np.abs(want)))
        oracle.step(zs, gen.order)
        got = flat(gen.master)
        assert np.max(np.abs(got - oracle.y)) < 1e-3 * max(1.0, np.max(np.abs(oracle.y)))
        path0 = np.concatenate([gen.state.buffers["path0"][n].double().reshape(-1).numpy() for n in SHAPES])
        assert np.max(np.abs(path0 - oracle.M[0])) < 5e-4 * max(1.0, np.max(np.abs(oracle.M[0])))
    assert oracle.t == 25
    # the transforms were exercised (members took path terms) and σ did adapt
    assert max(abs(b) for row in gens[-1].step.optimizer["members"] for b in row) > 1e-3
    assert abs(math.log(gens[-1].sigma / gens[0].sigma)) > 0.05


def test_lmmaes_improves_the_ellipsoid():
    rewards = [max(gen.rewards) for gen in run_lmmaes(60, sigma=0.2)]
    assert np.mean(rewards[-5:]) > 4 * np.mean(rewards[:5])  # rewards are negative: closer to 0


def test_replaying_the_records_reaches_the_same_bits():
    """The recorded steps alone (their numbers, no dot products) rebuild every member, the
    master and the paths bit for bit."""
    gens = list(run_lmmaes(6))
    master, state = copy.deepcopy(gens[0].start[0]), OptimizerState()
    for gen in gens:
        for m, evaluated in zip(gen.members, gen.weights, strict=True):
            rebuilt = copy.deepcopy(master)
            apply_member(rebuilt, gen.step, m.key, m.sign, member=m.index, state=state)
            assert torch.equal(flat_t(rebuilt), flat_t(evaluated))
        apply_step(master, state, gen.step)
        assert fingerprint(master) == gen.fingerprint
    for j in range(7):  # six paths and p_σ
        for n in SHAPES:
            assert torch.equal(state.buffers[f"path{j}"][n], gens[-1].state.buffers[f"path{j}"][n])


def flat_t(x: dict[str, torch.Tensor]) -> torch.Tensor:
    return torch.cat([x[n].reshape(-1) for n in SHAPES])


def test_transform_tracks_the_dense_transforms():
    rng = np.random.default_rng(0)
    n, m = 50, 4
    rates = Rates.of(n, 8, m)
    M = rng.normal(size=(m, n)) * 3
    z = rng.normal(size=n)
    alpha, beta = transform(rates, list(M @ z), (M @ M.T).tolist(), applied=3)
    d = z.copy()
    for j in range(3):
        d = (1 - rates.cd[j]) * d + rates.cd[j] * M[j] * (M[j] @ d)
    assert np.allclose(alpha * z + np.array(beta) @ M, d, rtol=1e-12, atol=1e-12)
    assert beta[3] == 0.0


@pytest.mark.parametrize("bad", [{"decay": [1.0], "gain": [1.0]}, {"decay": [1.0], "gain": [1.0], "move": ["x"]},
                                 {"decay": [], "gain": [], "move": []},
                                 {"decay": [10**400], "gain": [1.0], "move": [0.0]},
                                 {"decay": [1e300], "gain": [1.0], "move": [0.0]},
                                 {"decay": [0.5] * 300, "gain": [1.0] * 300, "move": [0.0] * 300}])
def test_a_malformed_paths_record_is_refused_in_one_line(bad):
    master = {"a": torch.zeros(4)}
    step = ReplayStep(run="toy", index=3, keys=[1], coefficients=[0.5], sigma=0.1,
                      optimizer={"name": "paths", **bad})
    with pytest.raises(SeedLedgerError, match="generation 3: optimizer paths") as err:
        apply_step(master, OptimizerState(), step)
    assert "\n" not in str(err.value)
