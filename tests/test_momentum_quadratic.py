"""Momentum with damping converges on a noisy quadratic where undamped momentum diverges.

No LLM: ES estimates the gradient of −‖θ − θ*‖² + noise, and replay's update (the same
function training uses) applies it. Same seeds, same lr; only the dampening differs.
"""

import random

import torch

from ledger import ReplayStep
from replay import update
from replay.noise import generate, round_coefficient, tensor_key
from trainers.es import ES


def final_loss(dampening: float, lr: float = 0.5, generations: int = 60, dim: int = 64) -> tuple[float, float]:
    rng = random.Random(0)
    master = {"w": torch.zeros(dim)}
    target = torch.ones(dim)
    state = update.OptimizerState()
    es = ES(16, mirrored=True)
    sigma = round_coefficient(0.1)
    first = None
    for g in range(1, generations + 1):
        members = es.ask(12345, g)
        rewards = []
        for m in members:
            w = master["w"] + m.sign * sigma * generate(tensor_key(m.key, "w"), dim)
            rewards.append(-float(((w - target) ** 2).sum()) + rng.gauss(0.0, 0.5))
        coefficients = es.tell(members, rewards, scale=1.0 / len(members))
        optimizer = {"name": "momentum", "lr": lr, "beta": 0.9, "dampening": dampening}
        step = ReplayStep("quadratic", g, [m.key for m in members], coefficients, sigma, optimizer)
        update.apply_step(master, state, step)
        loss = float(((master["w"] - target) ** 2).sum())
        first = loss if first is None else first
    return first, loss


def test_damped_momentum_converges_where_undamped_diverges():
    start = float(torch.ones(64).pow(2).sum())
    _, damped = final_loss(dampening=0.9)
    _, undamped = final_loss(dampening=0.0)
    assert damped < 0.25 * start, damped
    assert undamped > 2.0 * start, undamped
