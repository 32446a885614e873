"""The Policy base every algorithm subclasses: an explicit, typed surface the loop calls.

    policy = make_policy(cfg)                                # trainers.policy
    state = policy.restore(history)                          # a State, from the lineage's records
    if policy.needs_state:                                   # declared, not probed
        state = policy.attach(state, view)                   # the replay state (replay.paths.StateView)
    lr, sigma, extra = policy.hyperparameters(state, generation)   # σ rounded; extra commits
    members, state = policy.ask(state, run_key, generation, sigma=sigma)   # list[Member]
    decision = policy.decide(state, scored, lr=lr, sigma=sigma, optimizer=cfg.optimizer,
                             objectives=objectives)
    # decision.coefficients: one per member, each rounded by replay.noise.round_coefficient;
    # decision.optimizer: the update rule the record stores; decision.extra: what tell decided
    state = policy.observe(state, record)                    # after the record commits

Why state is a value. A policy object holds only its settings; everything that changes
(ES's adapted σ/lr, a GA's survivors and selection key, LM-MA-ES's σ, path layout and Gram
matrix) is a frozen `State` passed in and returned, as in evosax. So no call order is
hidden in attributes, and σ is an argument wherever it is used (never stashed), rounded in
one place (`applied_sigma`, in `hyperparameters`). `tell` returns a `Decision`, not a
State: what carries over is the record it commits, and `observe(state, record)` is the one
transition, so `restore` (used by resume and fork) reaches the same State as an
uninterrupted run (design.md invariant 11).

`decide` unpacks scored members into `tell(state, members, rewards, ...)`, the algorithm's
own method (a pure function of its arguments, which tests call directly). The loop knows
no algorithm: it never scales a reward itself.

What an algorithm needs of a run it declares on its class: the optimizers it can drive
(`optimizers`) and its `requires` (mirrored pairs or not, an adapter, a backend that builds
path terms: `trainers.requirements`), which the config checks in one place
(`trainers.policy.check_config`) before anything is built.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any, ClassVar

from seedledger.replay.noise import member_key, round_coefficient
from seedledger.trainers.adaptation import Adapted, Hyperparameters
from seedledger.trainers.member import Member
from seedledger.trainers.optim import OptimizerSpec
from seedledger.trainers.requirements import Requirement
from seedledger.trainers.settings import TrainSettings

Components = list[dict[str, float | None]]


@dataclass(frozen=True)
class Decision:
    """What `tell` decided: the coefficients to record and apply (member order, rounded),
    the update rule the record stores as `optimizer`, and what the record's `extra` carries
    about the decision (a GA's parents, CMA-ES's ranking; {} when nothing)."""

    coefficients: list[float]
    optimizer: dict[str, Any]
    extra: dict[str, Any] = field(default_factory=dict)


def keyed_members(run_key: int, generation: int, population: int, mirrored: bool) -> list[Member]:
    """Independent members (key i, sign +1), or mirrored pairs sharing the pair's key."""
    if not mirrored:
        return [Member(i, member_key(run_key, generation, i), 1) for i in range(population)]
    members = []
    for pair in range(population // 2):
        key = member_key(run_key, generation, pair)
        members += [Member(2 * pair, key, 1), Member(2 * pair + 1, key, -1)]
    return members


def scheduled(cfg: TrainSettings) -> Hyperparameters:
    """The lr/σ schedule (and adaptation) a config sets."""
    return Hyperparameters(cfg.lr, cfg.sigma, cfg.schedule, cfg.generations, getattr(cfg, "adaptation", None))


def applied_sigma(sigma: float) -> float:
    """σ as the record stores it and replay applies it: rounded to 12 significant bits so
    every σ·ε is exact in fp32 (design.md invariant 4). The one place σ is rounded."""
    return round_coefficient(sigma)


@dataclass(frozen=True)
class State:
    """What a policy carries from call to call (the module docstring); an algorithm with more
    subclasses it. `adapted`: the base lr/σ as `adaptation` moved them (None: no schedule)."""

    adapted: Adapted | None = None


class Policy(ABC):
    """An ask/tell algorithm over the ledger's keyed noise (the module docstring)."""

    name: ClassVar[str]  # the config's `algorithm` value
    label: ClassVar[str]  # how messages name it ("ES", "CMA-ES")
    settings: ClassVar[str | None] = None  # its config section (`ga:`), refused for another algorithm
    optimizers: ClassVar[frozenset[str] | None] = None  # the update rules it can drive (None: any)
    requires: ClassVar[tuple[Requirement, ...]] = ()  # what else it needs of every run
    needs_state: ClassVar[bool] = False  # hears the replay state (`attach`) before each generation
    hyper_names: ClassVar[str] = "σ"  # what it takes from lr/σ/schedule ("lr/σ" for ES)

    population: int
    mirrored: bool = False
    hyper: Hyperparameters | None = None

    @classmethod
    @abstractmethod
    def from_config(cls, cfg: TrainSettings) -> Policy:
        """The policy `cfg` (the engine's TrainConfig, read by attribute) describes."""

    @classmethod
    def requirements(cls, cfg: TrainSettings) -> tuple[Requirement, ...]:
        """What a run with config `cfg` must satisfy, in the order refusals are reported;
        an algorithm whose needs depend on its settings extends `requires` here."""
        return cls.requires

    def start(self) -> State:
        """The State before any record (a fresh run)."""
        return State(self.hyper.start() if self.hyper is not None else None)

    def restore(self, history: list) -> State:
        """The State after the lineage's records up to the starting generation: every
        algorithm's state follows from the last record alone."""
        return self.observe(self.start(), history[-1]) if history else self.start()

    def observe(self, state: State, record: Any) -> State:
        """The State past one committed record."""
        if self.hyper is None:
            return state
        return replace(state, adapted=self.hyper.observe(state.adapted, record))

    def attach(self, state: State, view: Any) -> State:
        """The State with the replay state before a generation (`replay.paths.StateView`);
        called only when the class declares `needs_state`."""
        return state

    def hyperparameters(self, state: State, generation: int) -> tuple[float, float, dict]:
        """(lr, σ, extra): the values in force (what the record stores and replay uses, σ
        rounded by `applied_sigma`) and what the generation's record carries about them."""
        if self.hyper is None or state.adapted is None:
            raise ValueError(f"this {self.label} policy was built without {self.hyper_names} settings")
        lr, sigma, extra = self.hyper.at(state.adapted, generation)
        return self.learning_rate(lr), applied_sigma(self.step_size(state, sigma)), extra

    def learning_rate(self, lr: float) -> float:
        """The lr the record stores, from the scheduled one (CMA-ES: c_m; a GA: 1)."""
        return lr

    def step_size(self, state: State, sigma: float) -> float:
        """σ before rounding, from the scheduled one (LM-MA-ES: from its path p_σ)."""
        return sigma

    def ask(self, state: State, run_key: int, generation: int, *, sigma: float) -> tuple[list[Member], State]:
        """The generation's members (noise key and sign), in member order, and the State
        `tell` reads (what `ask` drew)."""
        return keyed_members(run_key, generation, self.population, self.mirrored), state

    @abstractmethod
    def tell(
        self, state: State, members: list[Member], rewards: list[float], *, lr: float, sigma: float,
        optimizer: OptimizerSpec, components: Components | None = None,
        objectives: Mapping[str, float] | None = None, sample_rewards: list[list[float] | None] | None = None,
    ) -> Decision:
        """The decision for one generation's rewards (member order).

        `lr` and `sigma` are the values in force; `optimizer` says whether the update rule
        applies lr (momentum, Adam) or the coefficients must carry it (`optimizer.folds_lr`,
        SGD). `components` are the members' reward components and `objectives` the task's
        reward weights, for shapings that rank components (ES's `pareto`; it may add what
        it derived to the components dicts, which the record keeps as they are after
        `tell`). `sample_rewards` are each member's per-sample rewards (a GA's speciation)."""

    def decide(
        self, state: State, members: list[Member], *, lr: float, sigma: float, optimizer: OptimizerSpec,
        objectives: Mapping[str, float] | None = None,
    ) -> Decision:
        """`tell` on scored members (`Member.scored`)."""
        return self.tell(
            state, members, [m.reward for m in members], lr=lr, sigma=sigma, optimizer=optimizer,
            components=[m.components for m in members], objectives=objectives,
            sample_rewards=[m.sample_rewards for m in members],
        )

    def check_parent(self, state: State, memory: int | None = None) -> None:
        """Refuse (ValueError) a restored parent generation this policy cannot continue; a
        fork asks before its child run exists. Nothing to refuse by default."""
        return


__all__ = ["Components", "Decision", "Policy", "State", "applied_sigma", "keyed_members", "scheduled"]
