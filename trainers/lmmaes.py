"""LM-MA-ES: limited-memory matrix adaptation, with its paths as replay state.

LM-MA-ES (Loshchilov, Glasmachers & Beyer 2019, "Large scale black-box optimization by
limited-memory matrix adaptation", Algorithm 1) samples along m evolution paths Mⱼ of the
problem's dimension n, so time and memory are O(m·n), m = 4 + ⌊3 ln n⌋:

    zᵢ ~ N(0, I);  dᵢ = zᵢ;  for j < min(t, m): dᵢ ← (1 − c_d,j)·dᵢ + c_d,j·Mⱼ(Mⱼᵀdᵢ)
    xᵢ = y + σ·dᵢ
    y  ← y + c_m·σ·Σᵢ wᵢ d₍ᵢ₎             (the μ best, wᵢ ∝ ln((λ + 1)/2) − ln i, Σ wᵢ = 1)
    p_σ ← (1 − c_σ)·p_σ + √(μ_w c_σ (2 − c_σ))·Σᵢ wᵢ z₍ᵢ₎
    Mⱼ ← (1 − c_c,j)·Mⱼ + √(μ_w c_c,j (2 − c_c,j))·Σᵢ wᵢ z₍ᵢ₎
    σ  ← σ·exp(c_σ/2·(‖p_σ‖²/n − 1))
    c_σ = 2λ/n,  c_d,j = 1/(1.5ʲ n),  c_c,j = λ/(4ʲ n)           (j from 0)

Here zᵢ = ε(keyᵢ), the project's keyed noise. Because every transform adds multiples of
the paths, dᵢ = α·zᵢ + Σⱼ βᵢⱼ·Mⱼ with α = Πⱼ(1 − c_d,j) the same for every member: the
policy tracks (α, βᵢ) through the transforms from the dot products Mⱼ·zᵢ and the Gram
matrix Mⱼ·Mₖ (`replay.paths`, float64 on the CPU), so a member is its key plus m recorded
numbers. The update is then Σᵢ cᵢ·εᵢ with cᵢ = c_m·wᵢ·round(σα) plus Σⱼ moveⱼ·Mⱼ, and
every path (p_σ is path m) takes decayⱼ = 1 − cⱼ and g·gainⱼ, g = Σ cᵢ εᵢ, gain scaled so
g·gain = √(μ_w c (2 − c))·Σ wᵢ zᵢ: the `paths` rule of `replay.update`, whose numbers the
generation records (optimizer dict), so replay, verify, rebuild, resume and fork need no
dot product and reach the same bits.

σ: the first generation takes `sigma`; each later one σ_{g-1}·exp(c_σ/2·(‖p_σ‖²/n − 1))
from the recorded σ and the replayed p_σ (`adapt_sigma: false` keeps `sigma`/`schedule`).
Ties in ranking break by member index. tests/test_lmmaes.py checks members, mean, paths
and σ against pypop7's `LMMAES` (its `_update_distribution` on the same samples and ranking).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Protocol

from pydantic import BaseModel, ConfigDict, Field

from seedledger.ledger.errors import SeedLedgerError
from seedledger.replay.noise import member_key, round_coefficient
from seedledger.replay.paths import NAME as PATHS
from seedledger.trainers.adaptation import Hyperparameters
from seedledger.trainers.member import Member
from seedledger.trainers.optim import OptimizerSpec
from seedledger.trainers.policy_base import Components, Decision, Policy, State, scheduled
from seedledger.trainers.requirements import (
    MEMBER_TERMS,
    Capability,
    Holds,
    Kinds,
    Mirrored,
    Requirement,
)
from seedledger.trainers.settings import TrainSettings
from seedledger.trainers.shaping import ranking


class LMMAESSpec(BaseModel):
    """Config `lmmaes:` (used when `algorithm: lmmaes`)."""

    model_config = ConfigDict(extra="forbid")

    memory: int | None = Field(None, ge=1, le=256, description="paths m; default 4 + ⌊3 ln n⌋")
    cm: float = Field(1.0, gt=0.0, le=1.0, description="mean learning rate c_m (recorded as lr)")
    mu: int | None = Field(None, ge=1, description="parents μ; default λ/2")
    adapt_sigma: bool = Field(True, description="σ from the path p_σ (else from sigma/schedule)")


class PathView(Protocol):
    """What the policy reads of the replay state (`replay.paths` over the trained tensors)."""

    dimension: int  # n, the trained weights' count
    steps: int  # generations applied so far with the paths rule (t)

    def gram(self, m: int) -> list[list[float]]: ...

    def projections(self, keys: Sequence[int], m: int) -> list[list[float]]: ...  # [key][path]


@dataclass(frozen=True)
class Rates:
    """LM-MA-ES's learning rates for dimension n, population λ and m paths."""

    n: int
    cd: tuple[float, ...]
    cc: tuple[float, ...]
    csigma: float

    @classmethod
    def of(cls, n: int, population: int, memory: int | None) -> Rates:
        if n < 2 * population:  # c_σ = 2λ/n and c_c,0 = λ/n must stay below 1
            raise SeedLedgerError(f"algorithm lmmaes: its rates need at least 2·population = {2 * population} "
                                  f"trained weights; this run trains {n}")
        m = memory or 4 + int(3 * math.log(n))
        return cls(n, tuple(1.0 / (1.5**j * n) for j in range(m)),
                   tuple(population / (4.0**j * n) for j in range(m)), 2.0 * population / n)

    @property
    def memory(self) -> int:
        return len(self.cd)


def weights(population: int, mu: int | None = None) -> list[float]:
    """w₁ ≥ … ≥ w_μ > 0, Σ = 1: ln((λ + 1)/2) − ln i normalised (the paper's, and pypop7's)."""
    mu = mu or population // 2
    if not 1 <= mu <= population:
        raise ValueError(f"mu must be in 1..{population}, got {mu}")
    raw = [math.log((population + 1) / 2) - math.log(i + 1) for i in range(mu)]
    if raw[-1] <= 0.0:
        raise ValueError(f"mu {mu} is too large for population {population}: its last weight is not positive")
    total = math.fsum(raw)
    return [w / total for w in raw]


def transform(rates: Rates, projections: Sequence[float], gram: Sequence[Sequence[float]],
              applied: int) -> tuple[float, list[float]]:
    """(α, β) with d = α·z + Σⱼ βⱼ·Mⱼ after the first `applied` transforms, given Mⱼ·z
    (`projections`) and Mⱼ·Mₖ (`gram`); float64."""
    m = rates.memory
    alpha, beta = 1.0, [0.0] * m
    for j in range(min(applied, m)):
        along = alpha * projections[j] + math.fsum(beta[k] * gram[j][k] for k in range(m))
        keep = 1.0 - rates.cd[j]
        alpha *= keep
        beta = [b * keep for b in beta]
        beta[j] += rates.cd[j] * along
    return alpha, beta


@dataclass(frozen=True)
class LMMAESState(State):
    """LM-MA-ES's State. From the last record (`observe`): the σ it applied (`last_sigma`,
    None unless it was LM-MA-ES's), its paths' `layout` (memory, p_σ?) and whether they are
    `foreign` (a GA's survivor offsets). From `attach`, before each generation: the replay
    state `view`, the `rates` for its dimension and the Gram matrix of paths and p_σ."""

    last_sigma: float | None = None
    layout: tuple[int, bool] | None = None
    foreign: bool = False
    view: PathView | None = None
    rates: Rates | None = None
    gram: tuple[tuple[float, ...], ...] = ()


class LMMAES(Policy):
    """The LM-MA-ES policy; see the module docstring. It declares `needs_state`: the loop
    gives it the replay state (`attach`) before each generation."""

    name = "lmmaes"
    label = "LM-MA-ES"
    settings = "lmmaes"
    optimizers = frozenset({"sgd"})  # the update is the paths rule
    needs_state = True
    # It keeps m paths the size of the trained weights and builds members from them in the
    # evaluating process: adapter runs on the in-process hf backend.
    requires = (
        Kinds("algorithm lmmaes", "its paths are m copies of the trained weights; train an adapter (train: lora)",
              kinds=frozenset({"lora"})),
        Capability("algorithm lmmaes", "members carry path terms only the in-process hf backend builds; "
                   "use backend: hf and workers.pool: local", capability=MEMBER_TERMS),
        Mirrored("algorithm lmmaes", "its samples are independent; set mirrored: false", value=False),
    )

    @classmethod
    def requirements(cls, cfg: TrainSettings) -> tuple[Requirement, ...]:
        spec: LMMAESSpec = getattr(cfg, "lmmaes", None) or LMMAESSpec()  # its own section, by name
        return (
            *cls.requires,
            Holds("lmmaes.mu", f"{spec.mu} parents leave the last one a weight ln((λ+1)/2) − ln μ that is not "
                  f"positive; use μ < (population + 1)/2 = {(cfg.population + 1) / 2:g}",
                  holds=not spec.mu or 2 * spec.mu < cfg.population + 1),
            Holds("algorithm lmmaes", "σ follows its path p_σ; drop `adaptation` (or set lmmaes.adapt_sigma: false)",
                  holds=not (spec.adapt_sigma and cfg.adaptation is not None)),
        )

    def __init__(self, population: int, spec: LMMAESSpec, hyperparameters: Hyperparameters | None = None):
        if population < 2:
            raise ValueError(f"LM-MA-ES needs a population of at least 2, got {population}")
        self.population = population
        self.spec = spec
        self.hyper = hyperparameters
        self.weights = weights(population, spec.mu)
        self.mu_w = 1.0 / math.fsum(w * w for w in self.weights)

    @classmethod
    def from_config(cls, cfg: TrainSettings) -> LMMAES:
        return cls(cfg.population, getattr(cfg, "lmmaes", None) or LMMAESSpec(), hyperparameters=scheduled(cfg))

    def start(self) -> LMMAESState:
        return LMMAESState(super().start().adapted)

    def attach(self, state: State, view: PathView) -> LMMAESState:
        """The State with the replay state before a generation: its rates and its Gram
        matrix (paths and p_σ), taken once here for both σ and the members' transforms."""
        rates = Rates.of(view.dimension, self.population, self.spec.memory)
        self.check_parent(state, rates.memory)
        gram = view.gram(rates.memory + (1 if self.spec.adapt_sigma else 0))
        return replace(state, view=view, rates=rates, gram=tuple(tuple(row) for row in gram))

    def check_parent(self, state: LMMAESState, memory: int | None = None) -> None:
        """Refuse a restored parent generation whose paths this policy cannot continue. A fork
        asks before its run exists, without the dimension: `memory` None compares the
        config's `lmmaes.memory` when it sets one (its default depends on the dimension)."""
        memory = self.spec.memory if memory is None else memory
        if state.foreign:
            raise ValueError("lmmaes: the parent generation's paths state holds another policy's vectors (a GA's "
                             "survivor offsets); fork LM-MA-ES from an ES or LM-MA-ES generation")
        layout = state.layout  # path j (and p_σ) would mean another vector
        if layout is not None and (layout[1] != self.spec.adapt_sigma or memory not in (None, layout[0])):
            raise ValueError(f"lmmaes: the parent's paths have memory {layout[0]} and adapt_sigma "
                             f"{str(layout[1]).lower()}; a fork keeps both (this config: memory "
                             f"{'default' if memory is None else memory}, "
                             f"adapt_sigma {str(self.spec.adapt_sigma).lower()})")

    @staticmethod
    def _need(state: LMMAESState) -> tuple[PathView, Rates]:
        if state.view is None or state.rates is None:
            raise ValueError("LM-MA-ES needs the replay state: attach(state, view) before each generation")
        return state.view, state.rates

    def _sigma_path(self, state: LMMAESState) -> dict[str, float]:
        """σ's factor exp(c_σ/2·(‖p_σ‖²/n − 1)) and ‖p_σ‖², when σ follows p_σ from a
        previous LM-MA-ES generation ({} otherwise); the record's `extra` carries both."""
        if not (self.spec.adapt_sigma and state.last_sigma is not None):
            return {}
        _, rates = self._need(state)
        norm2 = state.gram[rates.memory][rates.memory]  # ‖p_σ‖²
        return {"sigma_factor": math.exp(rates.csigma / 2.0 * (norm2 / rates.n - 1.0)), "p_sigma_norm2": norm2}

    def learning_rate(self, lr: float) -> float:
        return self.spec.cm

    def step_size(self, state: LMMAESState, sigma: float) -> float:
        """σ_{g-1}·exp(c_σ/2·(‖p_σ‖²/n − 1)) after an LM-MA-ES generation, else the scheduled σ."""
        path = self._sigma_path(state)
        return state.last_sigma * path["sigma_factor"] if path else sigma

    def observe(self, state: State, record) -> LMMAESState:
        """σ and the paths' layout carry over from an LM-MA-ES record only (a fork of an ES run
        starts at `sigma`, with fresh paths); the replay state is attached anew each generation."""
        optimizer = record.optimizer or {}
        # the recombining form of the rule holds another policy's vectors (a GA's survivors)
        foreign = optimizer.get("name") == PATHS and "mix" in optimizer
        mine = optimizer.get("name") == PATHS and not foreign
        told = (record.extra or {}).get("lmmaes")
        memory = told.get("memory") if mine and isinstance(told, dict) else None
        decay = optimizer.get("decay")
        ok = isinstance(memory, int) and not isinstance(memory, bool) and isinstance(decay, list)
        return replace(super().observe(state, record), last_sigma=record.sigma if mine else None,
                       layout=(memory, len(decay) > memory) if ok else None, foreign=foreign,
                       view=None, rates=None, gram=())

    def ask(
        self, state: LMMAESState, run_key: int, generation: int, *, sigma: float,
    ) -> tuple[list[Member], LMMAESState]:
        """Each member's key, shrink α and terms round(σ·βᵢⱼ) along the paths (p_σ, the last
        path, has none)."""
        view, rates = self._need(state)
        keys = [member_key(run_key, generation, i) for i in range(self.population)]
        m = rates.memory
        gram = [row[:m] for row in state.gram[:m]]
        extra = (0.0,) if self.spec.adapt_sigma else ()
        members = []
        for i, (key, along) in enumerate(zip(keys, view.projections(keys, m), strict=True)):
            alpha, beta = transform(rates, along, gram, view.steps)
            members.append(Member(i, key, 1, alpha, tuple(round_coefficient(sigma * b) for b in beta) + extra))
        return members, state

    def tell(
        self, state: LMMAESState, members: list[Member], rewards: list[float], *, lr: float, sigma: float,
        optimizer: OptimizerSpec, components: Components | None = None,
        objectives: Mapping[str, float] | None = None, sample_rewards: list[list[float] | None] | None = None,
    ) -> Decision:
        """cᵢ = c_m·wᵢ·round(σα)·signᵢ for the μ best (0 for the rest); the paths' numbers
        are the rule the record stores."""
        if optimizer.name != "sgd":
            raise ValueError("algorithm lmmaes: the update is the paths rule, so optimizer must be sgd")
        if len(rewards) != len(members) or len(members) != self.population:
            raise ValueError("one reward per asked member")
        view, rates = self._need(state)
        scale = round_coefficient(sigma * members[0].shrink)  # round(σ·α): every member's factor on its noise
        order = ranking(rewards)
        coefficients = [0.0] * len(members)
        move = [0.0] * rates.memory
        for w, i in zip(self.weights, order, strict=False):
            coefficients[i] = round_coefficient(lr * w * scale * members[i].sign)
            for j in range(rates.memory):
                move[j] += lr * w * members[i].paths[j]
        # g = Σ cᵢ εᵢ = c_m·round(σα)·Σ wᵢ zᵢ (up to the rounding of cᵢ): gain turns it into
        # √(μ_w c (2 − c))·Σ wᵢ zᵢ for each path, p_σ last.
        rates_c = list(rates.cc) + ([rates.csigma] if self.spec.adapt_sigma else [])
        unit = lr * scale
        rule = {
            "name": PATHS,
            "decay": [1.0 - c for c in rates_c],
            "gain": [math.sqrt(self.mu_w * c * (2.0 - c)) / unit for c in rates_c],
            "move": [round_coefficient(v) for v in move] + ([0.0] if self.spec.adapt_sigma else []),
            **member_rule(members),
        }
        told = {"lmmaes": {"ranking": order, "mu": len(self.weights), "memory": rates.memory,
                           "applied": min(view.steps, rates.memory), **self._sigma_path(state)}}
        return Decision(coefficients, rule, told)


def member_rule(members: Sequence[Member]) -> dict:
    """How a generation's members are built (`replay.paths.member_settings`): their shared
    shrink α and each one's terms along the paths."""
    return {"shrink": members[0].shrink, "members": [list(m.paths) for m in members]}


__all__ = ["LMMAES", "LMMAESSpec", "LMMAESState", "PathView", "Rates", "member_rule", "transform", "weights"]
