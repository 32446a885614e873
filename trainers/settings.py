"""What trainers read of a run's config, as a type: `TrainSettings`.

Trainers cannot import engine (tests/test_layout.py), so the engine's `TrainConfig` is
handed to them as a value read by attribute. This protocol lists exactly those attributes,
so a trainer's signature says what it depends on and `TrainConfig` satisfies it
structurally (tests/test_trainer_settings.py checks every member on a validated config, and
that trainers read no attribute outside it). Each section's protocol sits beside its reader:
`requirements.RequirementSettings`, `rewards.kl.KLSettings`, `rewards.curriculum.CurriculumSettings`,
`rewards.passk.PassKSettings`, `adaptation.ScheduleSettings`.

Members are read-only properties: a validated config's fields satisfy them, and a narrower
field type (a `Literal`, a section class) still fits (properties are covariant).

An algorithm's own section (`ga:`, `cmaes:`, `lmmaes:`) is not listed: the algorithm reads
it by its `Policy.settings` name (`getattr`), so adding an algorithm touches no protocol; the
test checks every such name is a config key.
"""

from __future__ import annotations

from typing import Protocol

from seedledger.trainers.adaptation import AdaptationSpec, ScheduleSettings
from seedledger.trainers.optim import OptimizerSpec
from seedledger.trainers.requirements import RequirementSettings
from seedledger.trainers.rewards.curriculum import CurriculumSettings
from seedledger.trainers.rewards.kl import KLSettings
from seedledger.trainers.rewards.passk import PassKSettings
from seedledger.trainers.shaping import Shaping


class TrainSettings(RequirementSettings, Protocol):
    """A run's config as trainers read it (plus `mirrored`, `population`, `capabilities()`,
    `perturbation_type()` from RequirementSettings)."""

    @property
    def algorithm(self) -> str: ...  # trainers.policy.ALGORITHMS' key

    @property
    def sigma(self) -> float: ...

    @property
    def lr(self) -> float: ...

    @property
    def optimizer(self) -> OptimizerSpec: ...

    @property
    def schedule(self) -> ScheduleSettings: ...

    @property
    def adaptation(self) -> AdaptationSpec | None: ...

    @property
    def shaping(self) -> Shaping: ...

    @property
    def generations(self) -> int: ...

    @property
    def batch_size(self) -> int: ...

    @property
    def row_scores(self) -> bool: ...

    @property
    def passk(self) -> PassKSettings | None: ...

    @property
    def curriculum(self) -> CurriculumSettings | None: ...

    @property
    def kl(self) -> KLSettings | None: ...


__all__ = [
    "CurriculumSettings", "KLSettings", "PassKSettings", "RequirementSettings", "ScheduleSettings", "TrainSettings",
]
