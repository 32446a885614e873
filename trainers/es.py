"""Evolution strategies as an ask/tell policy (Qiu et al. 2025, OpenAI-ES style).

`ask` names the generation's members (noise key and sign); `tell` turns their rewards
into the coefficients that replay applies: θ ← θ + Σᵢ cᵢ·εᵢ. With plain SGD,
cᵢ = α·zᵢ/N (the paper's update); with momentum or Adam, cᵢ = zᵢ/N is the gradient
estimate and the rule applies α; zᵢ is the reward shaped by `trainers.shaping.shape`.
Mirrored pairs (ε, −ε) share one key and are applied as one term on that key: the
pair's first member carries the coefficient, the second 0.
Every coefficient is rounded by `replay.noise.round_coefficient` before it leaves here,
so what the ledger stores is exactly what is applied. The loop reaches this class through
`trainers.policy.make_policy`, never by name; its `ask` is the base's (`trainers.policy_base`).
"""

from __future__ import annotations

from collections.abc import Mapping

from seedledger.replay.noise import round_coefficient
from seedledger.trainers.adaptation import Hyperparameters
from seedledger.trainers.member import Member
from seedledger.trainers.optim import OptimizerSpec
from seedledger.trainers.policy_base import Components, Decision, Policy, State, scheduled
from seedledger.trainers.settings import TrainSettings
from seedledger.trainers.shaping import Shaping, shape


class ES(Policy):
    """The ES policy: the shared `ask` (mirrored pairs or independent members), `tell` returns
    the rounded coefficients; `hyperparameters(state, generation)` gives the lr and σ in
    force, σ rounded once by `policy_base.applied_sigma` (schedules, and the optional σ/lr
    adaptation of `trainers.adaptation`, whose state `restore` rebuilds from the lineage's
    records and `observe` advances past each one)."""

    name = "es"
    label = "ES"
    hyper_names = "lr/σ"

    def __init__(
        self, population: int, mirrored: bool = True, shaping: Shaping = "zscore",
        hyperparameters: Hyperparameters | None = None,
    ):
        if population < 1 or (mirrored and population % 2):
            raise ValueError(
                f"population must be a positive{' even' if mirrored else ''} number, got {population}"
            )
        self.population = population
        self.mirrored = mirrored
        self.shaping = shaping
        self.hyper = hyperparameters

    @classmethod
    def from_config(cls, cfg: TrainSettings) -> ES:
        # the engine's TrainConfig has lr/σ; a bare namespace may omit the schedule
        hyper = scheduled(cfg) if hasattr(cfg, "lr") else None
        return cls(cfg.population, mirrored=cfg.mirrored, shaping=cfg.shaping, hyperparameters=hyper)

    def tell(
        self, state: State, members: list[Member], rewards: list[float], *, lr: float, sigma: float,
        optimizer: OptimizerSpec, components: Components | None = None,
        objectives: Mapping[str, float] | None = None, sample_rewards: list[list[float] | None] | None = None,
    ) -> Decision:
        """Coefficients in member order: shaped rewards times α/N when the optimizer folds the
        learning rate into the coefficients (SGD), times 1/N when its rule applies α itself.
        ES records nothing beyond its coefficients and the configured optimizer."""
        scale = (lr if optimizer.folds_lr else 1.0) / len(members)
        coefficients = self.coefficients(members, rewards, scale, sigma, components, objectives)
        return Decision(coefficients, optimizer.record(lr))

    def coefficients(
        self, members: list[Member], rewards: list[float], scale: float, sigma: float,
        components: Components | None = None, objectives: Mapping[str, float] | None = None,
    ) -> list[float]:
        """`scale`·(shaped reward) per member, mirrored pairs folded onto the pair's first
        member, each rounded; `tell` chooses `scale`."""
        if len(rewards) != len(members):
            raise ValueError("one reward per member")
        z = shape(self.shaping, rewards, sigma, components, objectives)
        if not self.mirrored:
            return [round_coefficient(scale * m.sign * zi) for m, zi in zip(members, z, strict=True)]
        coefficients = []
        for i in range(0, len(members), 2):
            coefficients += [round_coefficient(scale * (z[i] - z[i + 1])), 0.0]
        return coefficients


__all__ = ["ES", "Member"]
