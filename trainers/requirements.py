"""What an algorithm or a reward needs of a run, as data, and the one check that reads it.

A policy class declares its `requires` (`trainers.policy_base.Policy.requirements`): plain
records such as "no mirrored pairs", "an adapter run", "members built by
a backend and pool that support path terms". Backends and pools declare what they support
in the config's capability tables (`cfg.capabilities()`). `first_unmet` walks a list of
requirements against a run's config and returns the first refusal, `{subject}: {why}`: the
one-line message `engine.config` raises.

Why data: which algorithm goes with which backend, perturbation kind and settings was
string comparisons spread over the config's validators; here adding an algorithm adds its
declarations on its class, and a backend says what it can do where the config names it.

The config is read by attribute (trainers cannot import engine): what a requirement reads
is `RequirementSettings` (`mirrored`, `population`, `capabilities()`, `perturbation_type()`),
part of `trainers.settings.TrainSettings`, which the engine's TrainConfig satisfies.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from seedledger.replay.kinds import PerturbationKind

# Capabilities an algorithm may require of the run's backend and pool. Which backend and
# pool have which is the config's to say, beside the names it accepts
# (engine.config.BACKEND_CAPABILITIES, engine.config_sections.POOL_CAPABILITIES), read
# here through `cfg.capabilities()`.
MEMBER_TERMS = "member_terms"  # members carry terms along replay-state vectors (paths, offsets)
BASE_LOGPROBS = "base_logprobs"  # token log-probabilities under the frozen base (the KL penalty)


class RequirementSettings(Protocol):
    """What a requirement reads of a run's config (read-only, so a validated config's fields
    satisfy it); `trainers.settings.TrainSettings` extends it with the rest trainers read."""

    @property
    def mirrored(self) -> bool: ...

    @property
    def population(self) -> int: ...

    def capabilities(self) -> frozenset[str]:
        """What both the run's backend and its pool support (MEMBER_TERMS, BASE_LOGPROBS)."""
        ...

    def perturbation_type(self) -> type[PerturbationKind]:
        """The run's replay kind, before any resolution."""
        ...


def perturbation_kind(cfg: RequirementSettings) -> str:
    """The run's perturbation kind as its replay kind names itself (`full`, `lowrank`,
    `lora`, `quant_scales`, `quant_codes`: `replay.kinds`), read from the config before any resolution."""
    return cfg.perturbation_type().label


@dataclass(frozen=True)
class Requirement:
    """One need; `subject` and `why` make its refusal, `{subject}: {why}` (`why` alone
    without a subject)."""

    subject: str
    why: str

    def met(self, cfg: RequirementSettings) -> bool:  # pragma: no cover - every kind overrides it
        raise NotImplementedError

    def refusal(self) -> str:
        return f"{self.subject}: {self.why}" if self.subject else self.why


@dataclass(frozen=True)
class Mirrored(Requirement):
    """Mirrored pairs on (`value` True, at least `minimum` members) or off (False)."""

    value: bool = True
    minimum: int = 0

    def met(self, cfg: RequirementSettings) -> bool:
        return cfg.mirrored == self.value and cfg.population >= self.minimum


@dataclass(frozen=True)
class Kinds(Requirement):
    """The perturbation kinds (`perturbation_kind`) the algorithm can train."""

    kinds: frozenset[str] = frozenset()

    def met(self, cfg: RequirementSettings) -> bool:
        return perturbation_kind(cfg) in self.kinds


@dataclass(frozen=True)
class Capability(Requirement):
    """Something the run's backend and pool must both support (`cfg.capabilities()`)."""

    capability: str = ""

    def met(self, cfg: RequirementSettings) -> bool:
        return self.capability in cfg.capabilities()


@dataclass(frozen=True)
class Holds(Requirement):
    """A condition on the algorithm's own settings, decided when the list is built."""

    holds: bool = True

    def met(self, cfg: RequirementSettings) -> bool:
        return self.holds


def first_unmet(requirements: Iterable[Requirement], cfg: RequirementSettings) -> str | None:
    """The refusal of the first requirement `cfg` does not meet, in declared order."""
    return next((r.refusal() for r in requirements if not r.met(cfg)), None)


__all__ = [
    "BASE_LOGPROBS", "MEMBER_TERMS", "Capability", "Holds", "Kinds", "Mirrored", "Requirement", "RequirementSettings",
    "first_unmet", "perturbation_kind",
]
