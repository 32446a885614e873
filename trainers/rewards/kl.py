"""A KL-to-base regulariser: reward − β·KL(member ‖ base), from the member's own tokens.

For a completion y sampled (or decoded greedily) from the member π, with per-token
log-probabilities log π(y_t) under the member and log π₀(y_t) under the frozen base model,
the sequence KL is estimated as Σ_t k(t) with (Schulman's estimators, as in TRL and RL2)

    k1 = log π(y_t) − log π₀(y_t)            unbiased, may be negative per token
    k3 = (ρ − 1) − log ρ,  ρ = π₀(y_t)/π(y_t)  unbiased, never negative, lower variance

and a member's KL is the mean over its completions. β is fixed, or adapted toward a
target KL per completion by the proportional controller of Ziegler et al. (TRL's and RL2's
AdaptiveKLController):

    β ← β · (1 + clip(KL/target − 1, −0.2, 0.2) · n / horizon),   n = completions scored.

β is a pure function of the run's recorded history (the β in force and the mean KL of
every generation are committed with it), so resume and fork continue with the same β.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal, Protocol

from seedledger.trainers.member import Member
from seedledger.trainers.requirements import BASE_LOGPROBS, Capability

Estimator = Literal["k1", "k3"]

# What the penalty needs of a run (`trainers.policy.check_config`): the members' tokens
# scored under the frozen base model.
REQUIRES = (Capability("kl", "the KL-to-base penalty needs backend: hf (it scores tokens under a frozen base model)",
                       capability=BASE_LOGPROBS),)


class KLSettings(Protocol):
    """The config's `kl` section as trainers read it (read-only: a validated section fits)."""

    @property
    def beta(self) -> float: ...

    @property
    def estimator(self) -> Estimator: ...

    @property
    def target(self) -> float | None: ...

    @property
    def horizon(self) -> float: ...


def sequence_kl(member: Sequence[float], base: Sequence[float], estimator: Estimator = "k3") -> float:
    """Σ_t k(t) over one completion's tokens (0.0 for an empty completion)."""
    if len(member) != len(base):
        raise ValueError("one base log-probability per member token")
    total = 0.0
    for lp, lp0 in zip(member, base, strict=True):
        log_ratio = lp0 - lp  # log ρ
        if estimator == "k1":
            total -= log_ratio
        else:
            total += math.expm1(log_ratio) - log_ratio
    return total


def next_beta(beta: float, kl: float, target: float | None, completions: int, horizon: float) -> float:
    """The β for the next generation (unchanged without a target)."""
    if target is None:
        return beta
    error = min(max(kl / target - 1.0, -0.2), 0.2)
    return beta * (1.0 + error * completions / horizon)


@dataclass
class KLPenalty:
    """The penalty's state across generations: the β in force (`kl` config, read by
    attribute: `beta`, `target`, `horizon`), and how many completions a member scores
    (`batch_size` × pass@k's samples per prompt), which the controller's step scales with."""

    spec: KLSettings
    beta: float
    batch_size: int
    samples: int = 1

    @classmethod
    def restore(cls, spec: KLSettings, batch_size: int, samples: int, history: list) -> KLPenalty:
        """The β in force for the next generation: `kl.beta` when fixed; with a `kl.target`,
        the controller's next step from the last recorded (β, mean KL), so a resumed or
        forked run continues where it left off."""
        last = next((r for r in reversed(history) if "kl" in r.extra), None)
        beta = spec.beta
        if spec.target is not None and last is not None:
            completions = last.population * len(last.batch_indices) * samples
            beta = next_beta(last.extra["kl"]["beta"], last.extra["kl"]["mean"], spec.target, completions,
                             spec.horizon)
        return cls(spec, beta, batch_size, samples)

    def penalise(self, members: list[Member]) -> tuple[list[Member], dict[str, float]]:
        """reward − β·KL for every member: the penalised reward is what the policy ranks and
        the ledger records; the task's own reward and the KL stay as components. Returns the
        members and the record's `extra["kl"]` (β in force, mean KL), and moves β on."""
        penalised = [
            m.scored(
                reward=m.reward - self.beta * m.kl,
                components={**m.components, "task_reward": m.reward, "kl": m.kl},
            )
            for m in members
        ]
        told = {"beta": self.beta, "mean": sum(m.kl for m in members) / len(members)}
        completions = len(members) * self.batch_size * self.samples
        self.beta = next_beta(self.beta, told["mean"], self.spec.target, completions, self.spec.horizon)
        return penalised, told
