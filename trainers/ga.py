"""A genetic algorithm as a policy whose every genome is a replayable seed (`algorithm: ga`).

In the spirit of Uber's deep-neuroevolution, a genome is its parent plus a mutation key.
Here the parent of every genome of generation g is the run's master after g − 1 (`RUN@g-1`),
so genome m of generation g is exactly `master + sign·σ·ε(key_m)`: the ledger's ordinary
member record (key, sign) *is* its genome, and `RUN@g#m` rebuilds it. Member 0 is the
elite when `elitism` is on: the master itself (sign 0), re-scored on this generation's
batch so it competes fairly with its mutants.

Selection picks the next master from the scored genomes:

- `truncation`: the `parents` best by (shared) fitness;
- `tournament`: `parents` tournaments of `tournament` genomes each, drawn from the
  generation's selection key, the best of each wins;

and then, with probability `crossover` (drawn from the same key), the next master is the
arithmetic crossover w·g_a + (1 − w)·g_b of the two best parents (w from the key, on a
1/4096 grid), else it is the best parent itself. Both are sums of the parents' mutation
terms on the same master, so the generation's applied coefficients (SGD, no lr) are
c_a = σ·s_a·w, c_b = σ·s_b·(1 − w) (or c_a = σ·s_a): replay, `verify`, seed files and forks
work unchanged, and `RUN@g` names the child, which generation g + 1 re-scores as its elite.
With elitism the master survives whenever it is selected (all coefficients 0).

Speciation is fitness sharing over the genomes' per-sample reward vectors (Goldberg &
Richardson 1987): genomes whose reward vectors lie within `radius` (RMS distance) of each
other share a niche, each genome's fitness (rewards shifted to be positive) is divided by
its niche count Σⱼ sh(dᵢⱼ), sh(d) = 1 − (d/radius)^alpha, so one behaviour cannot take every
parent slot. Why per-sample vectors: in weight space every genome is at the same distance
from every other (independent Gaussian mutations in 10⁸ dimensions); rewards are where
genomes differ in behaviour. Species (leader clustering in fitness order) are recorded.

State: none beyond the master (with one survivor; several keep offsets, below). Each
generation's choice depends only on its own scores, so resume and fork need nothing but
the records. The generation's record carries, in
`extra["ga"]`, the parents, crossover key and weight, and the species of every genome.
Ties break by member index.

Several survivors (`survivors: K > 1`; adapters, or full rank one member at a time): the K
selected genomes S₀ … S_{K−1} (the K best by shared fitness, or the distinct winners of K
tournaments) all live on, so a population keeps several lineages and fitness sharing keeps
them apart. S₀ becomes the
master; S_k (k ≥ 1) is kept as its offset M_{k−1} = S_k − S₀ from the master, a vector the
size of the trained weights held as replay state by the `paths` rule (`replay.paths`, its
`mix`/`noise` form), so every genome is still the master plus recorded numbers times
keyed noise and replayed vectors. Generation g + 1 evaluates, in member order, the
survivors unmutated (elitism: sign 0, path coefficient 1 on its offset) and then children:
each draws (from the generation's breeding key) one survivor, or with probability
`crossover` two distinct survivors a, b and a weight w on the 1/4096 grid, and is

    master + σ·ε(key) + Σₖ bₖ·M_k,   b the child's weights on the survivors' offsets
                                     (w·S_a + (1 − w)·S_b = master + w·M_a + (1 − w)·M_b)

The generation's `paths` rule then moves the master to S₀ (coefficient round(σ·sign) on
its noise, move = its b) and sets M_{k−1} = Σₗ (b(S_k) − b(S₀))ₗ·Mₗ + round(σ·sign)·ε(S_k)
− round(σ·sign)·ε(S₀): S_k − S₀ up to fp32 rounding (RUN@g#m always rebuilds exactly what
was evaluated). The record's `extra["ga"]` adds the survivors and every member's breeding
(parents and weight). The K survivors are the parents: a `parents` setting is refused.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from seedledger.replay.hashing import MASK64, mix
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

SELECTION_SLOT = 2_000_000  # the generation's selection/crossover key: member_key(run, g, slot)
BREEDING_SLOT = 2_000_001  # which survivors each child of the generation descends from
WEIGHT_BITS = 12


class Sharing(BaseModel):
    model_config = ConfigDict(extra="forbid")

    radius: float = Field(0.5, gt=0.0, description="niche radius, RMS distance of per-sample reward vectors")
    alpha: float = Field(1.0, gt=0.0, description="shape of the sharing function 1 − (d/radius)^alpha")


class GASpec(BaseModel):
    """Config `ga:` (used when `algorithm: ga`)."""

    model_config = ConfigDict(extra="forbid")

    selection: Literal["truncation", "tournament"] = Field(
        "truncation", description="the `parents` best, or the winners of `parents` tournaments"
    )
    parents: int = Field(2, ge=1, description="genomes selected as parents of the next master")
    tournament: int = Field(2, ge=2, description="genomes per tournament (selection: tournament)")
    crossover: float = Field(0.5, ge=0.0, le=1.0, description="probability of arithmetic crossover")
    elitism: bool = Field(True, description="the first members are the unmutated master (and survivors), "
                                            "re-scored")
    sharing: Sharing | None = Field(None, description="fitness sharing over per-sample rewards")
    survivors: int = Field(1, ge=1, le=64, description="genomes kept across generations (> 1: the rest ride as "
                                                       "offsets from the master, in the replay state)")


def uniform(key: int, draw: int) -> float:
    """The `draw`-th uniform in [0, 1) from `key` (53 bits of a splitmix mix)."""
    return (mix(key, draw) >> 11) / float(1 << 53)


def weight(key: int, draw: int) -> float:
    """A crossover weight on the 1/4096 grid (exact in fp32 and as a coefficient)."""
    return math.floor(uniform(key, draw) * (1 << WEIGHT_BITS)) / (1 << WEIGHT_BITS)


def breed(key: int, child: int, survivors: int, crossover: float) -> dict[int, float]:
    """Child `child`'s weights on the survivors {index: weight}: one survivor, or with
    probability `crossover` two distinct ones weighted w and 1 − w (draws 4·child.. of `key`)."""
    first = int(uniform(key, 4 * child + 1) * survivors)
    if survivors < 2 or uniform(key, 4 * child) >= crossover:
        return {first: 1.0}
    second = (first + 1 + int(uniform(key, 4 * child + 2) * (survivors - 1))) % survivors
    w = weight(key, 4 * child + 3)
    return {first: w, second: 1.0 - w} if 0.0 < w else {second: 1.0}


def distance(a: Sequence[float], b: Sequence[float]) -> float:
    """RMS distance between two reward vectors of equal length."""
    return math.sqrt(math.fsum((x - y) ** 2 for x, y in zip(a, b, strict=True)) / max(len(a), 1))


def shared_fitness(rewards: Sequence[float], vectors: Sequence[Sequence[float]], sharing: Sharing) -> list[float]:
    """Fitness (rewards shifted so the worst is 1e-9 above 0) divided by niche counts."""
    low = min(rewards)
    out = []
    for i, r in enumerate(rewards):
        niche = math.fsum(
            1.0 - (d / sharing.radius) ** sharing.alpha
            for v in vectors
            if (d := distance(vectors[i], v)) < sharing.radius
        )
        out.append((r - low + 1e-9) / niche)
    return out


def species(fitness: Sequence[float], vectors: Sequence[Sequence[float]], radius: float) -> list[int]:
    """Leader clustering: in fitness order (ties by index), a genome joins the first species
    whose leader lies within `radius`, else leads a new one. Species ids in leader order."""
    order = ranking(fitness)
    leaders: list[int] = []
    out = [0] * len(fitness)
    for i in order:
        for s, leader in enumerate(leaders):
            if distance(vectors[i], vectors[leader]) < radius:
                out[i] = s
                break
        else:
            out[i] = len(leaders)
            leaders.append(i)
    return out


def select(fitness: Sequence[float], spec: GASpec, key: int, count: int | None = None) -> list[int]:
    """Parent indices, best first: the `count` (default `parents`) best, or `count`
    tournament winners (draws 2.. of `key`; a genome may win twice). Ties break by member
    index."""
    n = len(fitness)
    count = spec.parents if count is None else count
    rank = ranking(fitness)
    if spec.selection == "truncation":
        return rank[: min(count, n)]
    position = {m: p for p, m in enumerate(rank)}
    winners, draw = [], 2
    for _ in range(count):
        entrants = []
        for _ in range(spec.tournament):
            entrants.append(int(uniform(key, draw) * n))
            draw += 1
        winners.append(min(entrants, key=position.__getitem__))
    return sorted(winners, key=position.__getitem__)


@dataclass(frozen=True)
class GAState(State):
    """A GA's State: `kept`, the survivors the last record left (the master and kept − 1
    offsets); what `ask` drew for `tell`: the selection `key` and each member's weights on
    the survivors (`bred`, None for an elite; empty with one survivor)."""

    kept: int = 1
    key: int = 0
    bred: tuple[dict[int, float] | None, ...] = ()


class GA(Policy):
    """The GA policy; see the module docstring."""

    name = "ga"
    label = "GA"
    settings = "ga"
    optimizers = frozenset({"sgd"})  # the child replaces the master
    requires = (
        Mirrored("algorithm ga", "genomes are single mutations; set mirrored: false", value=False),
    )
    # Survivors beyond the master ride as offsets the size of the trained weights that
    # members are built from in the evaluating process: the in-process hf backend (full
    # rank: K − 1 fp32 copies of the model beside the master; low-rank noise has no offsets).
    survivors_require = (
        Kinds("ga.survivors", "survivors are kept as full-size offsets; use train: full "
              "or an adapter (train: lora)", kinds=frozenset({"full", "lora"})),
        Capability("ga.survivors", "members carry offset terms only the in-process hf backend builds; "
                   "use backend: hf and workers.pool: local", capability=MEMBER_TERMS),
    )

    @classmethod
    def requirements(cls, cfg: TrainSettings) -> tuple[Requirement, ...]:
        spec: GASpec = getattr(cfg, "ga", None) or GASpec()  # its own section, by name
        needs = (*cls.requires, Holds("ga.parents", "more parents than the population holds",
                                      holds=spec.parents <= cfg.population))
        if spec.survivors == 1:
            return needs
        return (
            *needs,
            # a stored config spells the default out
            Holds("ga.parents", "with survivors > 1 the survivors are the parents; drop parents",
                  holds=spec.parents == GASpec.model_fields["parents"].default),
            *cls.survivors_require,
            Holds("ga.survivors", f"{spec.survivors} survivors leave no room for children in a population "
                  f"of {cfg.population}", holds=spec.survivors < cfg.population),
        )

    def __init__(self, population: int, spec: GASpec, hyperparameters: Hyperparameters | None = None):
        if population < 2:
            raise ValueError(f"a GA needs a population of at least 2, got {population}")
        if spec.survivors > 1 and population <= spec.survivors:
            raise ValueError(f"ga.survivors: {spec.survivors} survivors leave no room for children in a population "
                             f"of {population}")
        self.population = population
        self.spec = spec
        self.hyper = hyperparameters

    @classmethod
    def from_config(cls, cfg: TrainSettings) -> GA:
        return cls(cfg.population, getattr(cfg, "ga", None) or GASpec(), hyperparameters=scheduled(cfg))

    def learning_rate(self, lr: float) -> float:
        return 1.0  # the coefficients move the master to the child exactly

    def start(self) -> GAState:
        return GAState(super().start().adapted)

    def observe(self, state: State, record) -> GAState:
        return replace(super().observe(state, record), kept=self._survivors_of(record), key=0, bred=())

    def _survivors_of(self, record) -> int:
        """How many survivors `record` left in the replay state for this GA to breed from:
        1 unless it is a survivors GA's `paths` record (a fork keeps at most its own K)."""
        told = (record.extra or {}).get("ga")
        kept = told.get("survivors") if isinstance(told, dict) else None
        offsets = (record.optimizer or {}).get("mix")  # the rule says how many offsets replay keeps
        if (record.optimizer or {}).get("name") != PATHS or not isinstance(kept, list) or not isinstance(offsets, list):
            return 1
        return max(1, min(len(kept), len(offsets) + 1, self.spec.survivors))

    def ask(
        self, state: GAState, run_key: int, generation: int, *, sigma: float,
    ) -> tuple[list[Member], GAState]:
        """The genomes, and the State with the generation's selection key (and, with
        survivors, each member's breeding) for `tell`."""
        key = member_key(run_key, generation, SELECTION_SLOT)
        if self.spec.survivors == 1:
            members = [
                Member(i, member_key(run_key, generation, i), 0 if self.spec.elitism and i == 0 else 1)
                for i in range(self.population)
            ]
            return members, replace(state, key=key, bred=())
        breeding = member_key(run_key, generation, BREEDING_SLOT)
        elites = state.kept if self.spec.elitism else 0
        bred = tuple(None if i < elites else breed(breeding, i, state.kept, self.spec.crossover)
                     for i in range(self.population))
        members = [Member(i, member_key(run_key, generation, i), 0 if b is None else 1, 1.0,
                          tuple(self._offsets({i: 1.0} if b is None else b)))
                   for i, b in enumerate(bred)]
        return members, replace(state, key=key, bred=bred)

    def _offsets(self, weights: Mapping[int, float]) -> list[float]:
        """Weights on survivors as coefficients on the offsets M₀ … M_{K−2} (survivor 0 is
        the master and has none)."""
        return [weights.get(k + 1, 0.0) for k in range(self.spec.survivors - 1)]

    def tell(
        self, state: GAState, members: list[Member], rewards: list[float], *, lr: float, sigma: float,
        optimizer: OptimizerSpec, components: Components | None = None,
        objectives: Mapping[str, float] | None = None, sample_rewards: list[list[float] | None] | None = None,
    ) -> Decision:
        """The coefficients that move the master to the next one (the module docstring), the
        rule the record stores (SGD, or with survivors the `paths` rule) and `extra["ga"]`."""
        if optimizer.name != "sgd":
            raise ValueError("algorithm ga: the child replaces the master, so optimizer must be sgd")
        if len(rewards) != len(members):
            raise ValueError("one reward per member")
        vectors = [
            list(v) if v else [r]
            for v, r in zip(sample_rewards or [None] * len(rewards), rewards, strict=True)
        ]
        sharing = self.spec.sharing
        fitness = shared_fitness(rewards, vectors, sharing) if sharing else list(rewards)
        told = {
            "crossover_key": str(state.key & MASK64),
            "fitness": fitness,
            "species": species(fitness, vectors, sharing.radius) if sharing else None,
        }
        if self.spec.survivors > 1:
            coefficients, rule = self._survive(state, members, fitness, sigma, told)
        else:
            coefficients, rule = self._child(state.key, members, fitness, sigma, told), optimizer.record(lr)
        return Decision(coefficients, rule, {"ga": told})

    def _child(self, key: int, members: list[Member], fitness: list[float], sigma: float, told: dict) -> list[float]:
        """One survivor: the next master is the best parent or the crossover of the two best."""
        parents = select(fitness, self.spec, key)
        cross = len(set(parents)) >= 2 and uniform(key, 0) < self.spec.crossover
        coefficients = [0.0] * len(members)
        a = parents[0]
        if cross:
            b = next(p for p in parents if p != a)
            w = weight(key, 1)
            coefficients[a] = round_coefficient(sigma * members[a].sign * w)
            coefficients[b] = round_coefficient(sigma * members[b].sign * (1.0 - w))
        else:
            b, w = None, 1.0
            coefficients[a] = round_coefficient(sigma * members[a].sign)
        told |= {"parents": parents, "child": [a] if b is None else [a, b], "weight": w}
        return coefficients

    def _survive(self, state: GAState, members: list[Member], fitness: list[float], sigma: float,
                 told: dict) -> tuple[list[float], dict]:
        """K survivors: the master moves to the best, the others become offsets from it
        (the `paths` rule's mix/noise form; the module docstring)."""
        survivors = list(dict.fromkeys(select(fitness, self.spec, state.key, self.spec.survivors)))
        scale = [round_coefficient(sigma * m.sign) for m in members]
        best = survivors[0]
        coefficients = [0.0] * len(members)
        coefficients[best] = scale[best]
        m = self.spec.survivors - 1
        mix, noise = [[0.0] * m for _ in range(m)], [[0.0] * len(members) for _ in range(m)]
        for k, s in enumerate(survivors[1:]):
            mix[k] = [x - y for x, y in zip(members[s].paths, members[best].paths, strict=True)]
            noise[k][s] = scale[s]
            noise[k][best] -= scale[best]  # 0.0, not −0.0, for an elite
        rule = {"name": PATHS, "move": list(members[best].paths), "mix": mix, "noise": noise,
                "shrink": 1.0, "members": [list(mb.paths) for mb in members]}
        told |= {"parents": survivors, "child": [best], "weight": 1.0, "survivors": survivors,
                 "breeding": [None if bred is None else [[k, w] for k, w in bred.items()] for bred in state.bred]}
        return coefficients, rule


__all__ = ["GA", "GASpec", "GAState", "Sharing", "breed", "select", "shared_fitness", "species", "uniform", "weight"]
