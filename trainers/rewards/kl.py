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
from typing import Literal

Estimator = Literal["k1", "k3"]


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
