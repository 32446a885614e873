"""The lr and σ in force at each generation: base values × schedule, optionally adapted.

Config `adaptation` (off by default):

    adaptation:
      sigma: {rate: 0.2, target: 0.5, min: 1e-5, max: 0.05}   # the `pairs` rule
      lr: follow_sigma                                         # or fixed (default)

Why this σ rule. SNES/xNES adapt a scalar σ by Σᵢ uᵢ(‖εᵢ‖²/d − 1); with d ≈ 10⁸ weights
‖ε‖²/d is 1 ± 10⁻⁴, so σ would not move, and CSA's path length needs inner products of
noise vectors across generations (a full noise pass per pair). OpenAI-ES/evosax decay σ on a
fixed schedule (that is `schedule.sigma`). What rewards alone do tell, with mirrored pairs,
is the shape of the reward along each direction: a pair's half-difference (r⁺ − r⁻)/2 is its
odd, first-order part (σ·∇f·ε), its half-sum (r⁺ + r⁻)/2, centred over the pairs, the even
part (curvature, discrete jumps of greedy outputs). The rule keeps σ where the odd part
carries a `target` share q = Σ odd² / (Σ odd² + Σ even²) of the spread: q above target
(the finite difference is still linear) grows σ, below shrinks it, in log space by at most
`rate` per generation, within [min, max] — the step-size choice of finite differences
(largest h whose truncation error stays below the signal). A generation whose rewards all
tie carries no information and leaves σ alone. `lr: follow_sigma` keeps lr/σ constant, as
NES moves the mean in units of σ. It is a heuristic, and a tunable one (`seedledger tune`).

Replay needs nothing from here: each record carries the lr and σ it used. The state is a
pure function of the lineage's records: record g carries the adapted values in force in
`extra["adaptation"]` (with the base lr/σ they started from), and the values for g + 1
follow from them and g's rewards, so `resume` and `fork` rebuild it from the last record.
A fork that sets another `lr` or `sigma` starts adapting afresh from its own values.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Literal, Protocol

from pydantic import BaseModel, ConfigDict, Field, model_validator

from seedledger.trainers.requirements import Mirrored
from seedledger.trainers.schedules import Schedule

# What the `pairs` rule needs of a run (`trainers.policy.check_config`).
REQUIRES = (
    Mirrored("adaptation.sigma", "needs mirrored pairs, at least two (population >= 4)", value=True, minimum=4),
)


class ScheduleSettings(Protocol):
    """The config's `schedule` section as trainers read it (read-only: a validated section fits)."""

    @property
    def lr(self) -> Schedule: ...

    @property
    def sigma(self) -> Schedule: ...


class SigmaAdaptation(BaseModel):
    """The `pairs` rule (module docstring); needs mirrored pairs, at least two of them."""

    model_config = ConfigDict(extra="forbid")

    rule: Literal["pairs"] = Field(
        "pairs", description="`pairs`: σ from the mirrored pairs' rewards (the only rule)"
    )
    rate: float = Field(0.2, gt=0.0, le=1.0, description="largest change of log σ per generation")
    target: float = Field(0.5, gt=0.0, lt=1.0, description="share of the reward spread in the odd part")
    min: float = Field(1e-5, gt=0.0, description="the smallest σ the rule sets")
    max: float = Field(0.05, gt=0.0, description="the largest σ the rule sets")

    @model_validator(mode="after")
    def _bounds_in_order(self) -> SigmaAdaptation:
        if not self.min < self.max:
            raise ValueError(f"min ({self.min}) must be below max ({self.max})")
        return self


class AdaptationSpec(BaseModel):
    model_config = ConfigDict(extra="forbid")

    sigma: SigmaAdaptation | None = Field(
        None, description="adapt σ from the mirrored pairs' rewards; none: σ follows its schedule"
    )
    lr: Literal["fixed", "follow_sigma"] = Field(
        "fixed", description="`fixed`: lr follows its schedule; `follow_sigma`: lr/σ stays constant"
    )


def odd_share(rewards: list[float]) -> float | None:
    """q for mirrored rewards [r0⁺, r0⁻, r1⁺, r1⁻, ...]; None when they all tie."""
    if max(rewards) == min(rewards):
        return None
    odd = [(rewards[i] - rewards[i + 1]) / 2 for i in range(0, len(rewards), 2)]
    even = [(rewards[i] + rewards[i + 1]) / 2 for i in range(0, len(rewards), 2)]
    mean = math.fsum(even) / len(even)
    a = math.fsum(x * x for x in odd)
    b = math.fsum((x - mean) ** 2 for x in even)
    return a / (a + b)


def next_sigma(spec: SigmaAdaptation, sigma: float, rewards: list[float]) -> float:
    """σ for the next generation from this one's σ and mirrored rewards."""
    q = odd_share(rewards)
    if q is None:
        return sigma
    t = spec.target
    step = (q - t) / (1.0 - t) if q > t else (q - t) / t  # in [-1, 1]
    return min(max(sigma * math.exp(spec.rate * step), spec.min), spec.max)


@dataclass(frozen=True)
class Adapted:
    """The base lr and σ in force before schedules: the config's, or as the `pairs` rule and
    `follow_sigma` moved them (a policy's `State.adapted`)."""

    lr: float
    sigma: float


class Hyperparameters:
    """lr and σ per generation for one run: base × schedule factor, with the base adapted
    when `adaptation` asks. Holds only settings; the adapted base is an `Adapted` value that
    `start`/`observe` return, so the schedule itself is never state."""

    def __init__(
        self, lr: float, sigma: float, schedules: ScheduleSettings, generations: int,
        adaptation: AdaptationSpec | None = None,
    ):
        self.base = {"lr": lr, "sigma": sigma}
        self.schedules = schedules
        self.generations = generations
        self.spec = adaptation if adaptation and (adaptation.sigma or adaptation.lr != "fixed") else None

    def start(self) -> Adapted:
        """The config's own values: no record adapted them yet."""
        return Adapted(self.base["lr"], self.base["sigma"])

    def observe(self, adapted: Adapted, record: Any) -> Adapted:
        """The values after a committed record: its adapted values and rewards give the next
        ones. A record without them, or adapted from other base values, restarts from the base
        (so `observe(start(), history[-1])` is the state after the whole history)."""
        state = record.extra.get("adaptation") if self.spec else None
        if not state or state.get("base") != self.base:
            return self.start()
        sigma = state["sigma"]
        if self.spec.sigma is not None:
            sigma = next_sigma(self.spec.sigma, sigma, [m.reward for m in record.members])
        lr = self.base["lr"] * sigma / self.base["sigma"] if self.spec.lr == "follow_sigma" else state["lr"]
        return Adapted(lr, sigma)

    def at(self, adapted: Adapted, generation: int) -> tuple[float, float, dict[str, Any]]:
        """(lr, σ, extra) scheduled at `generation` from `adapted`; σ unrounded (the policy
        rounds it, `policy_base.applied_sigma`); `extra` is what the generation's record
        carries about the adaptation."""
        lr = adapted.lr * self.schedules.lr.factor(generation, self.generations)
        sigma = adapted.sigma * self.schedules.sigma.factor(generation, self.generations)
        extra = {}
        if self.spec is not None:
            extra["adaptation"] = {"lr": adapted.lr, "sigma": adapted.sigma, "base": dict(self.base)}
        return lr, sigma, extra


__all__ = ["REQUIRES", "AdaptationSpec", "Adapted", "Hyperparameters", "SigmaAdaptation", "next_sigma", "odd_share"]
