"""What damping does to momentum, on a noisy quadratic (no LLM), with fixed seeds.

ES estimates the gradient of −‖θ − θ*‖² + noise (64 parameters, 8 mirrored pairs, reward
noise N(0, 0.5²)); the ES policy turns rewards into coefficients and replay's update (the
function training uses) applies them. The findings, each a test below:

- At the same lr and β, momentum with dampening 0.9 converges and undamped momentum
  diverges (docs/design.md: "momentum without damping diverged").
- That is all damping is: v = β·v + (1 − d)·g scales v by (1 − d), so damped momentum
  follows undamped momentum at lr·(1 − d), step for step. Damping buys no more than a
  smaller momentum lr would.
- It is not SGD at lr·(1 − d): the two agree on the first step only; momentum then
  accumulates (steady step ≈ lr·(1 − d)/(1 − β)·g) and converges, SGD at lr·(1 − d) lags far
  behind.
- With dampening = β, the steady step is lr·g, the scale of SGD at the same lr: what
  damping buys is a momentum rule (an average of gradient estimates) that runs at the
  learning rate tuned for SGD; both reach a noise floor of the same size.
"""

import random
from functools import cache

import pytest
import torch

from seedledger.ledger import ReplayStep
from seedledger.replay import update
from seedledger.replay.noise import generate, round_coefficient, tensor_key
from seedledger.trainers.es import ES
from seedledger.trainers.optim import OptimizerSpec

DIM, LR, BETA, DAMPENING, GENERATIONS = 64, 0.5, 0.9, 0.9, 60
START = float(DIM)  # ‖0 − 1‖² for θ₀ = 0, θ* = 1


@cache
def losses(rule: str, lr: float, dampening: float = 0.0) -> tuple[float, ...]:
    """‖θ − θ*‖² after each generation of `rule` ("sgd" or "momentum" with β = 0.9 and
    `dampening`); the seeds of the noise and rewards are fixed."""
    optimizer = OptimizerSpec(name=rule, beta=BETA, dampening=dampening)
    rng = random.Random(0)
    master = {"w": torch.zeros(DIM)}
    target = torch.ones(DIM)
    state = update.OptimizerState()
    es = ES(16, mirrored=True)
    sigma = round_coefficient(0.1)
    out = []
    for g in range(1, GENERATIONS + 1):
        members, asked = es.ask(es.start(), 12345, g, sigma=sigma)
        rewards = []
        for m in members:
            w = master["w"] + m.sign * sigma * generate(tensor_key(m.key, "w"), DIM)
            rewards.append(-float(((w - target) ** 2).sum()) + rng.gauss(0.0, 0.5))
        coefficients = es.tell(asked, members, rewards, lr=lr, sigma=sigma, optimizer=optimizer).coefficients
        step = ReplayStep("quadratic", g, [m.key for m in members], coefficients, sigma, optimizer.record(lr))
        update.apply_step(master, state, step)
        out.append(float(((master["w"] - target) ** 2).sum()))
    return tuple(out)


def floor(trajectory: tuple[float, ...]) -> float:
    """Mean loss over the last 10 generations: the noise floor once converged."""
    return sum(trajectory[-10:]) / 10


def test_damped_momentum_converges_where_undamped_diverges():
    damped = losses("momentum", LR, DAMPENING)
    undamped = losses("momentum", LR, 0.0)
    assert floor(damped) < 0.25 * START, damped
    assert floor(undamped) > 2.0 * START, undamped
    assert max(undamped[-10:]) > max(undamped[:10]), "undamped keeps moving away"


def test_damping_is_momentum_at_a_smaller_learning_rate():
    """Damped at lr ≡ undamped at lr·(1 − d), up to fp32 rounding of the two products."""
    damped = losses("momentum", LR, DAMPENING)
    rescaled = losses("momentum", LR * (1 - DAMPENING), 0.0)
    assert damped == pytest.approx(rescaled, rel=1e-3)


def test_damped_momentum_is_not_sgd_at_the_damped_learning_rate():
    damped = losses("momentum", LR, DAMPENING)
    sgd = losses("sgd", LR * (1 - DAMPENING))
    assert damped[0] == pytest.approx(sgd[0], rel=1e-3)  # v₁ = (1 − d)·g: the same first step
    assert abs(damped[9] - sgd[9]) > 0.2 * START  # then momentum accumulates
    assert floor(damped) < 0.25 * START
    assert floor(sgd) > 0.4 * START  # SGD at lr·(1 − d) is still far from θ*


def test_damped_momentum_runs_at_the_sgd_learning_rate():
    """dampening = β: the steady step is lr·g, so the lr tuned for SGD suits momentum too;
    both converge, to noise floors within a factor of two of each other."""
    damped = losses("momentum", LR, BETA)
    sgd = losses("sgd", LR)
    assert floor(damped) < 0.25 * START and floor(sgd) < 0.25 * START
    assert 0.5 < floor(damped) / floor(sgd) < 2.0
