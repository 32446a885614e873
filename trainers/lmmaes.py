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
from dataclasses import dataclass
from typing import Any, Protocol

from pydantic import BaseModel, ConfigDict, Field

from seedledger.ledger.errors import SeedLedgerError
from seedledger.replay.noise import member_key, round_coefficient
from seedledger.replay.paths import NAME as PATHS
from seedledger.trainers.adaptation import Hyperparameters
from seedledger.trainers.cmaes import ranking
from seedledger.trainers.member import Member
from seedledger.trainers.optim import OptimizerSpec
from seedledger.trainers.policy_base import Decision, Policy, scheduled
from seedledger.trainers.requirements import (
    MEMBER_TERMS,
    Capability,
    Holds,
    Kinds,
    Mirrored,
    Requirement,
)


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
    def requirements(cls, cfg: Any) -> tuple[Requirement, ...]:
        spec = cfg.lmmaes or LMMAESSpec()
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
        self.rates: Rates | None = None
        self._view: PathView | None = None
        self._gram: list[list[float]] = []
        self._sigma_told: dict = {}
        self._last_sigma: float | None = None  # the last committed generation's σ
        self._layout: tuple[int, bool] | None = None  # (memory, p_σ?) of the last paths record
        self._foreign = False  # the last record's paths are not LM-MA-ES's
        self._sigma = 0.0
        self._scale = 0.0  # round(σ·α): every member's factor on its own noise
        self._alpha = 1.0
        self._paths: list[list[float]] = []  # per member: rounded σ·βᵢⱼ

    @classmethod
    def from_config(cls, cfg: Any) -> LMMAES:
        return cls(cfg.population, getattr(cfg, "lmmaes", None) or LMMAESSpec(), hyperparameters=scheduled(cfg))

    def attach(self, view: PathView) -> None:
        """The replay state before a generation: its Gram matrix (paths and p_σ) is taken
        once here, for both σ and the members' transforms."""
        self._view = view
        if self.rates is None or self.rates.n != view.dimension:
            self.rates = Rates.of(view.dimension, self.population, self.spec.memory)
        self.check_parent(self.rates.memory)
        self._gram = view.gram(self.rates.memory + (1 if self.spec.adapt_sigma else 0))

    def check_parent(self, memory: int | None = None) -> None:
        """Refuse a restored parent generation whose paths this policy cannot continue. A fork
        asks before its run exists, without the dimension: `memory` None compares the
        config's `lmmaes.memory` when it sets one (its default depends on the dimension)."""
        memory = self.spec.memory if memory is None else memory
        if self._foreign:
            raise ValueError("lmmaes: the parent generation's paths state holds another policy's vectors (a GA's "
                             "survivor offsets); fork LM-MA-ES from an ES or LM-MA-ES generation")
        layout = self._layout  # path j (and p_σ) would mean another vector
        if layout is not None and (layout[1] != self.spec.adapt_sigma or memory not in (None, layout[0])):
            raise ValueError(f"lmmaes: the parent's paths have memory {layout[0]} and adapt_sigma "
                             f"{str(layout[1]).lower()}; a fork keeps both (this config: memory "
                             f"{'default' if memory is None else memory}, "
                             f"adapt_sigma {str(self.spec.adapt_sigma).lower()})")

    def _need(self) -> tuple[PathView, Rates]:
        if self._view is None or self.rates is None:
            raise ValueError("LM-MA-ES needs the replay state: attach(view) before each generation")
        return self._view, self.rates

    def hyperparameters(self, generation: int) -> tuple[float, float, dict]:
        _, sigma, extra = self._scheduled(generation)
        if self.spec.adapt_sigma and self._last_sigma is not None:
            _, rates = self._need()
            norm2 = self._gram[rates.memory][rates.memory]  # ‖p_σ‖²
            factor = math.exp(rates.csigma / 2.0 * (norm2 / rates.n - 1.0))
            sigma = round_coefficient(self._last_sigma * factor)
            self._sigma_told = {"sigma_factor": factor, "p_sigma_norm2": norm2}
        else:
            self._sigma_told = {}
        self._sigma = sigma
        return self.spec.cm, sigma, extra

    def restore(self, history: list) -> None:
        super().restore(history)
        self._last_sigma, self._layout, self._foreign = None, None, False
        if history:
            self.observe(history[-1])

    def observe(self, record) -> None:
        """σ and the paths' layout carry over from an LM-MA-ES record only (a fork of an ES run
        starts at `sigma`, with fresh paths)."""
        super().observe(record)
        optimizer = record.optimizer or {}
        # the recombining form of the rule holds another policy's vectors (a GA's survivors)
        self._foreign = optimizer.get("name") == PATHS and "mix" in optimizer
        mine = optimizer.get("name") == PATHS and not self._foreign
        self._last_sigma = record.sigma if mine else None
        told = (record.extra or {}).get("lmmaes")
        memory = told.get("memory") if mine and isinstance(told, dict) else None
        decay = optimizer.get("decay")
        ok = isinstance(memory, int) and not isinstance(memory, bool) and isinstance(decay, list)
        self._layout = (memory, len(decay) > memory) if ok else None

    def ask(self, run_key: int, generation: int) -> list[Member]:
        view, rates = self._need()
        keys = [member_key(run_key, generation, i) for i in range(self.population)]
        m = rates.memory
        gram = [row[:m] for row in self._gram[:m]]
        extra = [0.0] if self.spec.adapt_sigma else []  # p_σ, the last path, has no member terms
        self._paths = []
        for along in view.projections(keys, m):
            self._alpha, beta = transform(rates, along, gram, view.steps)
            self._paths.append([round_coefficient(self._sigma * b) for b in beta] + extra)
        self._scale = round_coefficient(self._sigma * self._alpha)
        return [Member(i, key, 1, self._alpha, tuple(row)) for i, (key, row) in enumerate(zip(keys, self._paths,
                                                                                             strict=True))]

    def member_rule(self) -> dict:
        """How this generation's members are built (`replay.paths.member_settings`)."""
        return {"shrink": self._alpha, "members": self._paths}

    def tell(
        self, members: list[Member], rewards: list[float], *, lr: float, optimizer: OptimizerSpec,
        components: list[dict[str, float | None]] | None = None,
        objectives: Mapping[str, float] | None = None,
        sample_rewards: list[list[float] | None] | None = None,
    ) -> Decision:
        """cᵢ = c_m·wᵢ·round(σα)·signᵢ for the μ best (0 for the rest); the paths' numbers
        are the rule the record stores."""
        if optimizer.name != "sgd":
            raise ValueError("algorithm lmmaes: the update is the paths rule, so optimizer must be sgd")
        if len(rewards) != len(members) or len(members) != len(self._paths):
            raise ValueError("one reward per asked member")
        _, rates = self._need()
        order = ranking(rewards)
        coefficients = [0.0] * len(members)
        move = [0.0] * rates.memory
        for w, i in zip(self.weights, order, strict=False):
            coefficients[i] = round_coefficient(lr * w * self._scale * members[i].sign)
            for j in range(rates.memory):
                move[j] += lr * w * self._paths[i][j]
        # g = Σ cᵢ εᵢ = c_m·round(σα)·Σ wᵢ zᵢ (up to the rounding of cᵢ): gain turns it into
        # √(μ_w c (2 − c))·Σ wᵢ zᵢ for each path, p_σ last.
        rates_c = list(rates.cc) + ([rates.csigma] if self.spec.adapt_sigma else [])
        unit = lr * self._scale
        rule = {
            "name": PATHS,
            "decay": [1.0 - c for c in rates_c],
            "gain": [math.sqrt(self.mu_w * c * (2.0 - c)) / unit for c in rates_c],
            "move": [round_coefficient(v) for v in move] + ([0.0] if self.spec.adapt_sigma else []),
            **self.member_rule(),
        }
        told = {"lmmaes": {"ranking": order, "mu": len(self.weights), "memory": rates.memory,
                           "applied": min(self._need()[0].steps, rates.memory), **self._sigma_told}}
        return Decision(coefficients, rule, told)


__all__ = ["LMMAES", "LMMAESSpec", "PathView", "Rates", "transform", "weights"]
