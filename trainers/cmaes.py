"""Separable CMA-ES as a policy whose samples are the ledger's keyed noise (`algorithm: cmaes`).

Sep-CMA-ES (Ros & Hansen 2008) samples xᵢ = m + σ·D·zᵢ and moves the mean by
m ← m + c_m·σ·D·Σᵢ wᵢ z_(i), the weighted sum of the μ = λ/2 best samples (weights
wᵢ ∝ ln(μ + 1) − ln i, as `cmaes.SepCMA`). Here zᵢ = sign·ε(keyᵢ), the project's counter
noise, and the master is the mean, so with D = 1 the update is Σᵢ cᵢ·εᵢ with
cᵢ = c_m·σ·w_rank(i)·signᵢ: the ES record's form, applied by replay with SGD (lr = c_m) and
exactly replayable; mirrored pairs fold onto the pair's first member.

Why D = 1 and σ from the config. Sep-CMA's own learning rates for the diagonal
(c₁, c_μ ~ 1/d), the paths (c_c = 4/(d + 4)) and the step size (c_σ = (μ_eff + 2)/(d + μ_eff + 3))
all scale as 1/d. For the weights of even a small adapter (d ≥ 10⁵) they move D and σ by
less than 10⁻⁴ per generation (tests/test_cmaes.py measures this with `cmaes.SepCMA` on
identical samples), and tracking p_σ or D exactly would need a d-vector outside the ledger.
So in this regime sep-CMA-ES *is* the (μ/μ_w, λ)-ES kept here: recombination weights and
c_m from CMA, σ from `sigma`/`schedule` (or `adaptation`, with mirrored pairs). The policy
has no state beyond the master, so resume and fork need only the records.

ESSA (`train.essa`, arXiv 2507.04453) runs this policy over an SFT adapter's singular
values, a much smaller d: r·modules, e.g. 8 × 210 = 1,680 on SmolLM2. There, at λ = 8,
SepCMA's c_μ is 7.4·10⁻⁴ and c_σ/d_σ 2.9·10⁻³ per generation: D and σ would drift by a few
percent over tens of generations, which this policy leaves to `sigma`/`schedule`.

Rewards are stored raw; ranking is by reward, ties broken by member index (the order
`cmaes.SepCMA.tell`'s stable sort gives for equal values).
"""

from __future__ import annotations

import math
from collections.abc import Mapping

from pydantic import BaseModel, ConfigDict, Field

from seedledger.replay.noise import round_coefficient
from seedledger.trainers.adaptation import Hyperparameters
from seedledger.trainers.member import Member
from seedledger.trainers.optim import OptimizerSpec
from seedledger.trainers.policy_base import Components, Decision, Policy, State, scheduled
from seedledger.trainers.requirements import Holds, Requirement
from seedledger.trainers.settings import TrainSettings
from seedledger.trainers.shaping import ranking


class CMAESSpec(BaseModel):
    """Config `cmaes:` (used when `algorithm: cmaes`)."""

    model_config = ConfigDict(extra="forbid")

    cm: float = Field(1.0, gt=0.0, le=1.0, description="mean learning rate c_m (recorded as lr)")
    mu: int | None = Field(None, ge=1, description="parents μ; default λ/2 (SepCMA's)")


def recombination_weights(population: int, mu: int | None = None) -> list[float]:
    """w₁ ≥ … ≥ w_μ > 0, Σ = 1: ln(μ + 1) − ln i normalised (SepCMA's eq. 49)."""
    mu = mu or population // 2
    if not 1 <= mu <= population:
        raise ValueError(f"mu must be in 1..{population}, got {mu}")
    raw = [math.log(mu + 1) - math.log(i + 1) for i in range(mu)]
    total = math.fsum(raw)
    return [w / total for w in raw]


class CMAES(Policy):
    """The sep-CMA-ES policy; see the module docstring. Its `ask` is the base's."""

    name = "cmaes"
    label = "CMA-ES"
    settings = "cmaes"
    optimizers = frozenset({"sgd"})

    @classmethod
    def requirements(cls, cfg: TrainSettings) -> tuple[Requirement, ...]:
        spec: CMAESSpec | None = getattr(cfg, "cmaes", None)  # its own section, by name
        mu = spec.mu if spec else None
        return (*cls.requires, Holds("cmaes.mu", "more parents than the population holds",
                                     holds=not mu or mu <= cfg.population))

    def __init__(
        self, population: int, spec: CMAESSpec, mirrored: bool = False,
        hyperparameters: Hyperparameters | None = None,
    ):
        if population < 2 or (mirrored and population % 2):
            raise ValueError(f"population must be at least 2{' and even' if mirrored else ''}, got {population}")
        self.population = population
        self.spec = spec
        self.mirrored = mirrored
        self.hyper = hyperparameters
        self.weights = recombination_weights(population, spec.mu)

    @classmethod
    def from_config(cls, cfg: TrainSettings) -> CMAES:
        spec = getattr(cfg, "cmaes", None) or CMAESSpec()
        return cls(cfg.population, spec, mirrored=cfg.mirrored, hyperparameters=scheduled(cfg))

    def learning_rate(self, lr: float) -> float:
        return self.spec.cm

    def tell(
        self, state: State, members: list[Member], rewards: list[float], *, lr: float, sigma: float,
        optimizer: OptimizerSpec, components: Components | None = None,
        objectives: Mapping[str, float] | None = None, sample_rewards: list[list[float] | None] | None = None,
    ) -> Decision:
        """cᵢ = c_m·σ·w_rank(i)·signᵢ for the μ best (0 for the rest), rounded; the ranking
        goes to the record's `extra`."""
        if optimizer.name != "sgd":
            raise ValueError("algorithm cmaes: the mean update is applied as is, so optimizer must be sgd")
        if len(rewards) != len(members):
            raise ValueError("one reward per member")
        order = ranking(rewards)
        raw = [0.0] * len(members)
        for w, i in zip(self.weights, order, strict=False):
            raw[i] = lr * sigma * w * members[i].sign
        if self.mirrored:  # one term per key: the pair's first member carries the sum
            raw = [raw[i] + raw[i + 1] if i % 2 == 0 else 0.0 for i in range(len(raw))]
        return Decision([round_coefficient(c) for c in raw], optimizer.record(lr),
                        {"cmaes": {"ranking": order, "mu": len(self.weights)}})


__all__ = ["CMAES", "CMAESSpec", "recombination_weights"]
