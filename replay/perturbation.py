"""The historic names of the perturbation kinds (``replay.kinds``) and the low-rank factors
(``replay.lowrank``), for callers written before kinds were types.

``Perturbation()`` is the full kind, ``Perturbation.lowrank(rank, targets)`` a checked
low-rank one, ``Perturbation.lora(spec)`` an adapter, ``Perturbation.from_run(noise_spec,
param_selection)`` whatever a run's stored strings name; each returns a
``replay.kinds.PerturbationKind``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from .adapter import LoraSpec
from .kinds import (
    DEFAULT_TARGETS,
    KNOWN_SPECS,
    Adapter,
    Full,
    LowRank,
    PerturbationKind,
    from_run,
    step_kind,
)
from .lowrank import RANKS, check_matrix, factor_keys, factors, key_table, stacked_factors

__all__ = ["DEFAULT_TARGETS", "KNOWN_SPECS", "RANKS", "Perturbation", "PerturbationKind", "check_matrix",
           "check_spec", "factor_keys", "factors", "key_table", "stacked_factors", "step_perturbation"]


class Perturbation:
    """Factories of the kinds under their historic names (``Perturbation(kind, rank,
    targets, adapter)`` builds the kind those fields describe, unchecked, as the old
    dataclass did)."""

    def __new__(cls, kind: str = "full", rank: int = 0, targets: Sequence[str] = (),
                adapter: LoraSpec | None = None) -> PerturbationKind:  # type: ignore[misc]
        if adapter is not None:
            return Adapter(adapter)
        return Full() if kind == "full" else LowRank(rank, tuple(targets))

    from_run = staticmethod(from_run)
    lowrank = staticmethod(LowRank.of)
    lora = staticmethod(Adapter)


def check_spec(noise_spec: str, param_selection: str) -> PerturbationKind:
    """What seed-file import and rebuild call to refuse runs this replay cannot apply."""
    return from_run(noise_spec, param_selection)


def step_perturbation(step: Any) -> PerturbationKind:
    """The perturbation of one replay step (``replay.kinds.step_kind``)."""
    return step_kind(step)
