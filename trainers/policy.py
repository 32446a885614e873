"""The algorithms the config can select, and the one check of what each needs of a run.

A policy (ES, GA, CMA-ES, LM-MA-ES) subclasses `trainers.policy_base.Policy`: `ask`, one
`tell` that returns a `Decision`, `hyperparameters`, `restore`, `observe`, and the replay
state hook `attach` for a class that declares `needs_state`. This module maps the config's
`algorithm` to its class (`ALGORITHMS`), builds it (`make_policy`) and checks a config
against every class's declarations (`check_config`, called by `engine.config`), so the
loop and the config name no algorithm.

Adding an algorithm: a module with its `Policy` subclass (its `from_config`, `tell` and
declarations), its entry in `ALGORITHMS`, and its name (and settings section, if any) in
the config's schema.
"""

from __future__ import annotations

from seedledger.ledger.errors import SeedLedgerError
from seedledger.trainers.adaptation import REQUIRES as ADAPTATION_REQUIRES
from seedledger.trainers.cmaes import CMAES
from seedledger.trainers.es import ES
from seedledger.trainers.ga import GA
from seedledger.trainers.lmmaes import LMMAES
from seedledger.trainers.member import Member
from seedledger.trainers.policy_base import Decision, Policy
from seedledger.trainers.requirements import Holds, first_unmet
from seedledger.trainers.rewards.kl import REQUIRES as KL_REQUIRES
from seedledger.trainers.settings import TrainSettings

__all__ = ["ALGORITHMS", "Decision", "Member", "Policy", "check_config", "make_policy"]

# algorithm name -> its Policy class, in the order the config's refusals are checked
ALGORITHMS: dict[str, type[Policy]] = {cls.name: cls for cls in (ES, GA, CMAES, LMMAES)}


def make_policy(cfg: TrainSettings) -> Policy:
    """The policy a training config selects by its `algorithm` key (default `es`).

    `cfg` is the engine's TrainConfig (trainers cannot import engine, so it is read by
    attribute). A config without an `algorithm` field is ES: that is what every run
    recorded so far was trained with."""
    name = getattr(cfg, "algorithm", "es")
    try:
        cls = ALGORITHMS[name]
    except KeyError:
        known = ", ".join(sorted(ALGORITHMS))
        raise SeedLedgerError(f"algorithm: unknown algorithm {name!r} (known: {known})") from None
    return cls.from_config(cfg)


def check_config(cfg: TrainSettings) -> str | None:
    """The first thing `cfg` asks that its algorithm, rewards or backend cannot do, as the
    one-line refusal the config reports (None: the combination is sound). Order: the KL
    penalty's backend, the algorithm's optimizer, each algorithm's requirements (or its
    settings given for another algorithm), mirrored pairs, σ adaptation."""
    selected = ALGORITHMS[cfg.algorithm]
    optimizers = selected.optimizers
    checks = [
        *(KL_REQUIRES if cfg.kl is not None else ()),
        Holds(f"algorithm {selected.name}", "its update is applied as is, so optimizer must be "
              f"{' or '.join(sorted(optimizers or ()))}", holds=optimizers is None or cfg.optimizer.name in optimizers),
    ]
    for cls in ALGORITHMS.values():
        if cls is selected:
            checks += cls.requirements(cfg)
        elif cls.settings is not None:
            checks.append(Holds(cls.settings, f"settings given but algorithm is not {cls.name}",
                                holds=getattr(cfg, cls.settings) is None))
    checks.append(Holds("", f"population must be even when mirrored (got {cfg.population})",
                        holds=not (cfg.mirrored and cfg.population % 2)))
    if cfg.adaptation and cfg.adaptation.sigma:
        checks += ADAPTATION_REQUIRES
    return first_unmet(checks, cfg)
