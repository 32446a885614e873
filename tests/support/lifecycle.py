"""The run lifecycle contract's cases: every perturbation kind × algorithm that the config
accepts, as a `tiny` training config (tests/test_lifecycle.py runs the contract on each).

A kind or algorithm joins by being registered (`replay.kinds.KINDS`,
`trainers.policy.ALGORITHMS`) and giving its settings below; `test_every_registered_kind_
and_algorithm_has_settings` fails naming one that is registered without them, and the
pairs the config refuses are left out by validation itself, never by a list here.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from seedledger.engine.config import validate
from seedledger.ledger.errors import SeedLedgerError

BASE: dict[str, Any] = {
    "model": "tiny",
    "task": {"name": "arithmetic", "rewards": ["task", {"fn": "length", "limit": 20}]},
    "population": 4,
    "generations": 3,
    "batch_size": 2,
    "max_new_tokens": 4,
    "anchor_every": 2,  # resume and rebuild start from an anchor that must hold the kind's state
    "seed": 3,
}

# each kind's config on its own scale (σ and lr are in the units of what it trains)
KIND_SETTINGS: dict[str, dict[str, Any]] = {
    "Full": {"sigma": 0.05, "lr": 0.05},
    "LowRank": {"perturbation": {"kind": "lowrank", "rank": 4}, "members_per_forward": 4,
                "sigma": 0.05, "lr": 0.05},
    "Adapter": {"train": {"kind": "lora", "rank": 4, "target_modules": ["q_proj", "v_proj"]},
                "sigma": 0.05, "lr": 0.05},
    "QuantScales": {"train": {"kind": "quant_scales", "targets": ["q_proj", "v_proj"]},
                    "sigma": 1e-4, "lr": 1e-4},
    "QuantCodes": {"train": {"kind": "quant_codes", "targets": ["q_proj", "v_proj"]},
                   "sigma": 1e-3, "lr": 6e-4, "optimizer": "adam"},
}

# each algorithm's settings (a variant after "+"); the others apply their update as is
# (lr 1, sgd), where ES follows the kind's optimizer
ALGORITHM_SETTINGS: dict[str, dict[str, Any]] = {
    "es": {},
    "ga": {"algorithm": "ga", "mirrored": False, "lr": 1.0, "optimizer": "sgd"},
    "ga+survivors": {"algorithm": "ga", "mirrored": False, "ga": {"survivors": 2, "crossover": 0.5},
                     "lr": 1.0, "optimizer": "sgd"},
    "cmaes": {"algorithm": "cmaes", "mirrored": True, "lr": 1.0, "optimizer": "sgd"},
    "lmmaes": {"algorithm": "lmmaes", "mirrored": False, "lmmaes": {"memory": 3}, "lr": 1.0, "optimizer": "sgd"},
}


@dataclass(frozen=True)
class Case:
    kind: str
    algorithm: str
    config: dict[str, Any] = field(hash=False, compare=False)

    @property
    def id(self) -> str:
        return f"{self.kind}-{self.algorithm}"


def config_of(kind: str, algorithm: str) -> dict[str, Any]:
    settings = dict(KIND_SETTINGS[kind])
    return {**BASE, **settings, **ALGORITHM_SETTINGS[algorithm]}


def accepted(config: dict[str, Any]) -> str | None:
    """None if the config validates, else its one-line refusal."""
    try:
        validate(dict(config), "lifecycle case")
    except SeedLedgerError as exc:
        return str(exc)
    return None


def cases() -> tuple[list[Case], dict[str, str]]:
    """(the accepted kind × algorithm cases, {refused case id: the config's refusal})."""
    run, refused = [], {}
    for kind in KIND_SETTINGS:
        for algorithm in ALGORITHM_SETTINGS:
            config = config_of(kind, algorithm)
            refusal = accepted(config)
            if refusal is None:
                run.append(Case(kind, algorithm, config))
            else:
                refused[f"{kind}-{algorithm}"] = refusal
    return run, refused
