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

State: none beyond the master. Each generation's choice depends only on its own scores,
so resume and fork need nothing but the records. The generation's record carries, in
`extra["ga"]`, the parents, crossover key and weight, and the species of every genome.
Ties break by member index.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from replay.hashing import MASK64, mix
from replay.noise import member_key, round_coefficient
from trainers.adaptation import Hyperparameters
from trainers.es import Member
from trainers.optim import OptimizerSpec

SELECTION_SLOT = 2_000_000  # the generation's selection/crossover key: member_key(run, g, slot)
WEIGHT_BITS = 12


class Sharing(BaseModel):
    model_config = ConfigDict(extra="forbid")

    radius: float = Field(0.5, gt=0.0, description="niche radius, RMS distance of per-sample reward vectors")
    alpha: float = Field(1.0, gt=0.0, description="shape of the sharing function 1 − (d/radius)^alpha")


class GASpec(BaseModel):
    """Config `ga:` (used when `algorithm: ga`)."""

    model_config = ConfigDict(extra="forbid")

    selection: Literal["truncation", "tournament"] = "truncation"
    parents: int = Field(2, ge=1, description="genomes selected as parents of the next master")
    tournament: int = Field(2, ge=2, description="genomes per tournament (selection: tournament)")
    crossover: float = Field(0.5, ge=0.0, le=1.0, description="probability of arithmetic crossover")
    elitism: bool = Field(True, description="member 0 is the unmutated master, re-scored")
    sharing: Sharing | None = Field(None, description="fitness sharing over per-sample rewards")


def uniform(key: int, draw: int) -> float:
    """The `draw`-th uniform in [0, 1) from `key` (53 bits of a splitmix mix)."""
    return (mix(key, draw) >> 11) / float(1 << 53)


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
    order = sorted(range(len(fitness)), key=lambda i: (-fitness[i], i))
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


def select(fitness: Sequence[float], spec: GASpec, key: int) -> list[int]:
    """Parent indices, best first: the `parents` best, or `parents` tournament winners
    (draws 2.. of `key`; a genome may win twice). Ties break by member index."""
    n = len(fitness)
    rank = sorted(range(n), key=lambda i: (-fitness[i], i))
    if spec.selection == "truncation":
        return rank[: min(spec.parents, n)]
    position = {m: p for p, m in enumerate(rank)}
    winners, draw = [], 2
    for _ in range(spec.parents):
        entrants = []
        for _ in range(spec.tournament):
            entrants.append(int(uniform(key, draw) * n))
            draw += 1
        winners.append(min(entrants, key=position.__getitem__))
    return sorted(winners, key=position.__getitem__)


class GA:
    """The GA policy (`trainers.policy.Policy`); see the module docstring."""

    def __init__(self, population: int, spec: GASpec, hyperparameters: Hyperparameters | None = None):
        if population < 2:
            raise ValueError(f"a GA needs a population of at least 2, got {population}")
        self.population = population
        self.spec = spec
        self.hyper = hyperparameters
        self._key = 0
        self._sigma = 0.0
        self._told: dict = {}

    def hyperparameters(self, generation: int) -> tuple[float, float, dict]:
        if self.hyper is None:
            raise ValueError("this GA policy was built without σ settings")
        lr, sigma, extra = self.hyper.at(generation)
        self._sigma = sigma
        return 1.0, sigma, extra  # lr 1: the coefficients move the master to the child exactly

    def restore(self, history: list) -> None:
        if self.hyper is not None:
            self.hyper.restore(history)

    def observe(self, record) -> None:
        if self.hyper is not None:
            self.hyper.observe(record)

    def ask(self, run_key: int, generation: int) -> list[Member]:
        self._key = member_key(run_key, generation, SELECTION_SLOT)
        return [
            Member(i, member_key(run_key, generation, i), 0 if self.spec.elitism and i == 0 else 1)
            for i in range(self.population)
        ]

    def tell(
        self, members: list[Member], rewards: list[float], *, lr: float, optimizer: OptimizerSpec,
        components: list[dict[str, float | None]] | None = None,
        objectives: Mapping[str, float] | None = None,
        sample_rewards: list[list[float] | None] | None = None,
    ) -> list[float]:
        """The coefficients that move the master to the next one (the module docstring)."""
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
        parents = select(fitness, self.spec, self._key)
        cross = len(set(parents)) >= 2 and uniform(self._key, 0) < self.spec.crossover
        coefficients = [0.0] * len(members)
        a = parents[0]
        if cross:
            b = next(p for p in parents if p != a)
            w = math.floor(uniform(self._key, 1) * (1 << WEIGHT_BITS)) / (1 << WEIGHT_BITS)
            coefficients[a] = round_coefficient(self._sigma * members[a].sign * w)
            coefficients[b] = round_coefficient(self._sigma * members[b].sign * (1.0 - w))
        else:
            b, w = None, 1.0
            coefficients[a] = round_coefficient(self._sigma * members[a].sign)
        self._told = {"ga": {
            "parents": parents,
            "child": [a] if b is None else [a, b],
            "weight": w,
            "crossover_key": str(self._key & MASK64),
            "fitness": fitness,
            "species": species(fitness, vectors, sharing.radius) if sharing else None,
        }}
        return coefficients

    def told(self) -> dict:
        """What the last `tell` decided, for the generation record's `extra`."""
        return self._told


__all__ = ["GA", "GASpec", "Sharing", "select", "shared_fitness", "species", "uniform"]
