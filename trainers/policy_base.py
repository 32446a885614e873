"""The Policy base every algorithm subclasses: an explicit, typed surface the loop calls.

    policy = make_policy(cfg)                          # trainers.policy
    policy.restore(history)                            # the lineage's records so far
    if policy.needs_state:                             # declared, not probed
        policy.attach(view)                            # the replay state (replay.paths.StateView)
    lr, sigma, extra = policy.hyperparameters(generation)   # extra commits with the record
    members = policy.ask(run_key, generation)          # list[Member], member order
    decision = policy.decide(scored, lr=lr, optimizer=cfg.optimizer, objectives=objectives)
    # decision.coefficients: one per member, each rounded by replay.noise.round_coefficient;
    # decision.optimizer: the update rule the record stores; decision.extra: what tell decided
    policy.observe(record)                             # after the record commits

`decide` unpacks scored members into `tell(members, rewards, ...)`, the algorithm's own
method (a pure function of rewards, which tests call directly). The loop knows no
algorithm: it never scales a reward itself.

State that spans generations (ES's adapted σ/lr, a GA's survivors, LM-MA-ES's σ) is a pure
function of the ledger's records: `restore` rebuilds it from the lineage's records and
`observe` advances it past each committed one, so `resume` and `fork`, which build a fresh
policy, reach the same bits as an uninterrupted run.

What an algorithm needs of a run it declares on its class: the optimizers it can drive
(`optimizers`) and its `requires` (mirrored pairs or not, an adapter, a backend that builds
path terms: `trainers.requirements`), which the config checks in one place
(`trainers.policy.check_config`) before anything is built.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

from seedledger.replay.noise import member_key
from seedledger.trainers.adaptation import Hyperparameters
from seedledger.trainers.member import Member
from seedledger.trainers.optim import OptimizerSpec
from seedledger.trainers.requirements import Requirement

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


def scheduled(cfg: Any) -> Hyperparameters:
    """The lr/σ schedule (and adaptation) a config sets."""
    return Hyperparameters(cfg.lr, cfg.sigma, cfg.schedule, cfg.generations, getattr(cfg, "adaptation", None))


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
    _sigma: float | None = None  # the σ in force, set by `hyperparameters`

    @classmethod
    @abstractmethod
    def from_config(cls, cfg: Any) -> Policy:
        """The policy `cfg` (the engine's TrainConfig, read by attribute) describes."""

    @classmethod
    def requirements(cls, cfg: Any) -> tuple[Requirement, ...]:
        """What a run with config `cfg` must satisfy, in the order refusals are reported;
        an algorithm whose needs depend on its settings extends `requires` here."""
        return cls.requires

    def ask(self, run_key: int, generation: int) -> list[Member]:
        """The generation's members (noise key and sign), in member order."""
        return keyed_members(run_key, generation, self.population, self.mirrored)

    @abstractmethod
    def tell(
        self, members: list[Member], rewards: list[float], *, lr: float, optimizer: OptimizerSpec,
        components: Components | None = None, objectives: Mapping[str, float] | None = None,
        sample_rewards: list[list[float] | None] | None = None,
    ) -> Decision:
        """The decision for one generation's rewards (member order).

        `lr` is the learning rate in force; `optimizer` says whether the update rule applies
        it (momentum, Adam) or the coefficients must carry it (`optimizer.folds_lr`, SGD).
        `components` are the members' reward components and `objectives` the task's reward
        weights, for shapings that rank components (ES's `pareto`; it may add what it
        derived to the components dicts, which the record keeps as they are after `tell`).
        `sample_rewards` are each member's per-sample rewards (a GA's speciation)."""

    def decide(
        self, members: list[Member], *, lr: float, optimizer: OptimizerSpec,
        objectives: Mapping[str, float] | None = None,
    ) -> Decision:
        """`tell` on scored members (`Member.scored`)."""
        return self.tell(
            members, [m.reward for m in members], lr=lr, optimizer=optimizer,
            components=[m.components for m in members], objectives=objectives,
            sample_rewards=[m.sample_rewards for m in members],
        )

    def hyperparameters(self, generation: int) -> tuple[float, float, dict]:
        """(lr, σ, extra): the values in force (what the record stores and replay uses) and
        what the generation's record carries about the policy's state."""
        lr, sigma, extra = self._scheduled(generation)
        return self.learning_rate(lr), sigma, extra

    def learning_rate(self, lr: float) -> float:
        """The lr the record stores, from the scheduled one (CMA-ES: c_m; a GA: 1)."""
        return lr

    def _scheduled(self, generation: int) -> tuple[float, float, dict]:
        if self.hyper is None:
            raise ValueError(f"this {self.label} policy was built without {self.hyper_names} settings")
        lr, sigma, extra = self.hyper.at(generation)
        self._sigma = sigma
        return lr, sigma, extra

    def restore(self, history: list) -> None:
        """Rebuild the state from the lineage's records up to the starting generation."""
        if self.hyper is not None:
            self.hyper.restore(history)

    def observe(self, record: Any) -> None:
        """Advance the state past one committed record."""
        if self.hyper is not None:
            self.hyper.observe(record)

    def attach(self, view: Any) -> None:
        """The replay state before a generation (`replay.paths.StateView`); called only when
        the class declares `needs_state`."""
        return

    def check_parent(self, memory: int | None = None) -> None:
        """Refuse (ValueError) a restored parent generation this policy cannot continue; a
        fork asks before its child run exists. Nothing to refuse by default."""
        return


__all__ = ["Components", "Decision", "Policy", "keyed_members", "scheduled"]
