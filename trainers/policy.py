"""The policy surface the generation loop talks to: ask for members, tell their rewards.

A policy (ES today; GA, CMA-ES or low-rank ES later) owns everything algorithm-specific:
which members a generation evaluates and how their rewards become the coefficients that
replay applies (θ ← rule(θ, Σᵢ cᵢ·εᵢ)). The loop stays algorithm-agnostic: it asks,
evaluates, tells, records and applies, and never scales a reward itself.

    policy = make_policy(cfg)
    policy.restore(history)                            # the lineage's records so far
    lr, sigma, extra = policy.hyperparameters(generation)   # extra commits with the record
    members = policy.ask(run_key, generation)          # list[Member], member order
    coeffs = policy.tell(members, rewards, lr=lr, optimizer=cfg.optimizer,
                         components=components, objectives=task.objectives())
    # coeffs: one per member, already rounded by replay.noise.round_coefficient
    extra |= policy.told()                             # what tell decided, for the record
    policy.observe(record)                             # after the record commits

Two optional methods: `attach(view)` hears the replay state (`replay.paths.StateView`)
before each generation's `hyperparameters` (LM-MA-ES builds members from dot products with
its paths), and `update_rule(lr)` gives the optimizer dict the record stores instead of the
config's optimizer (the `paths` rule's numbers: LM-MA-ES, a GA with survivors).

State that spans generations (ES's adapted σ/lr, later CMA-ES's covariance or a GA's
elite) is a pure function of the ledger's records: `restore` rebuilds it from the
lineage's records and `observe` advances it past each committed one, so `resume` and
`fork`, which build a fresh policy, reach the same bits as an uninterrupted run.
"""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

from seedledger.ledger.errors import SeedLedgerError
from seedledger.trainers.adaptation import Hyperparameters
from seedledger.trainers.cmaes import CMAES, CMAESSpec
from seedledger.trainers.es import ES, Member
from seedledger.trainers.ga import GA, GASpec
from seedledger.trainers.lmmaes import LMMAES, LMMAESSpec
from seedledger.trainers.optim import OptimizerSpec

__all__ = ["ALGORITHMS", "Member", "Policy", "make_policy"]


@runtime_checkable
class Policy(Protocol):
    def ask(self, run_key: int, generation: int) -> list[Member]:
        """The generation's members (noise key and sign), in member order."""
        ...

    def tell(
        self, members: list[Member], rewards: list[float], *, lr: float, optimizer: OptimizerSpec,
        components: list[dict[str, float | None]] | None = None,
        objectives: dict[str, float] | None = None,
        sample_rewards: list[list[float] | None] | None = None,
    ) -> list[float]:
        """The coefficients to record and apply, in member order, each already rounded.

        `lr` is the learning rate in force; `optimizer` says whether the update rule applies
        it (momentum, Adam) or the coefficients must carry it (`optimizer.folds_lr`, SGD).
        `components` are the members' reward components and `objectives` the task's reward
        weights (`Task.objectives`), for shapings that rank components (ES's `pareto`); such
        a shaping may add what it derived to the components dicts (`pareto_front`), and
        the loop records the dicts as they are after `tell`. `sample_rewards` are each
        member's per-sample rewards (a GA's speciation compares them)."""
        ...

    def told(self) -> dict:
        """What the last `tell` decided that the generation's record should carry in its
        `extra` (a GA's parents and crossover key); {} when nothing."""
        ...

    def hyperparameters(self, generation: int) -> tuple[float, float, dict]:
        """(lr, σ, extra): the values in force (what the record stores and replay uses) and
        what the generation's record carries about the policy's state."""
        ...

    def restore(self, history: list) -> None:
        """Rebuild the state from the lineage's records up to the starting generation."""
        ...

    def observe(self, record) -> None:
        """Advance the state past one committed record."""
        ...


def _es(cfg: Any) -> ES:
    hyper = None
    if hasattr(cfg, "lr"):  # the engine's TrainConfig (a bare namespace may omit the schedule)
        hyper = Hyperparameters(
            cfg.lr, cfg.sigma, cfg.schedule, cfg.generations, getattr(cfg, "adaptation", None)
        )
    return ES(cfg.population, mirrored=cfg.mirrored, shaping=cfg.shaping, hyperparameters=hyper)


def _hyper(cfg: Any) -> Hyperparameters:
    return Hyperparameters(cfg.lr, cfg.sigma, cfg.schedule, cfg.generations, getattr(cfg, "adaptation", None))


def _ga(cfg: Any) -> GA:
    return GA(cfg.population, getattr(cfg, "ga", None) or GASpec(), hyperparameters=_hyper(cfg))


def _cmaes(cfg: Any) -> CMAES:
    spec = getattr(cfg, "cmaes", None) or CMAESSpec()
    return CMAES(cfg.population, spec, mirrored=cfg.mirrored, hyperparameters=_hyper(cfg))


def _lmmaes(cfg: Any) -> LMMAES:
    return LMMAES(cfg.population, getattr(cfg, "lmmaes", None) or LMMAESSpec(), hyperparameters=_hyper(cfg))


# algorithm name -> factory(cfg). A new algorithm adds an entry here and a value to the
# config's `algorithm` field; the loop does not change.
ALGORITHMS = {"es": _es, "ga": _ga, "cmaes": _cmaes, "lmmaes": _lmmaes}


def make_policy(cfg: Any) -> Policy:
    """The policy a training config selects by its `algorithm` key (default `es`).

    `cfg` is the engine's TrainConfig (trainers cannot import engine, so it is read by
    attribute). A config without an `algorithm` field is ES: that is what every run
    recorded so far was trained with."""
    name = getattr(cfg, "algorithm", "es")
    try:
        factory = ALGORITHMS[name]
    except KeyError:
        raise SeedLedgerError(f"algorithm: unknown algorithm {name!r} (known: {', '.join(sorted(ALGORITHMS))})") from None
    return factory(cfg)
