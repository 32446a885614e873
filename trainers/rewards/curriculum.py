"""A curriculum that moves a task's difficulty level by its recent success rate.

Deterministic: the level depends only on the success rates fed in, so the engine can rebuild
it on resume by feeding the rates recorded in the ledger again. Each change is returned as
a JSON-able record, which the engine commits with its generation, in the generation row's
``extra`` (``level`` in force, ``success_rate``, and ``curriculum``: the change), in the same
transaction as the rest of the generation, not as a separate event.

A curriculum needs a task with at least two levels (the generators: arithmetic,
countdown); the config refuses one on a single-level task.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from seedledger.trainers.member import Member


class CurriculumSettings(Protocol):
    """The config's `curriculum` section as trainers read it (read-only: a validated section fits)."""

    @property
    def window(self) -> int: ...

    @property
    def raise_above(self) -> float: ...

    @property
    def lower_below(self) -> float: ...

    @property
    def threshold(self) -> float: ...


def success_rate(rewards: Sequence[float], threshold: float = 1.0) -> float:
    """Fraction of rewards ``>= threshold`` (0.0 for none)."""
    return sum(1 for r in rewards if r >= threshold) / len(rewards) if rewards else 0.0


@dataclass
class Curriculum:
    """Raise the level when the mean rate over ``window`` generations exceeds ``raise_above``,
    lower it below ``lower_below``; the window restarts after each change."""

    levels: int
    level: int = 0
    window: int = 5
    raise_above: float = 0.7
    lower_below: float = 0.2
    _rates: deque = field(default_factory=deque, repr=False)

    def __post_init__(self) -> None:
        if self.levels < 2:
            raise ValueError(f"curriculum needs a task with at least 2 levels, not {self.levels}")
        if not 0 <= self.level < self.levels or self.window < 1:
            raise ValueError("curriculum needs 0 <= level < levels and window >= 1")
        if not 0.0 <= self.lower_below < self.raise_above <= 1.0:
            raise ValueError("curriculum needs 0 <= lower_below < raise_above <= 1")

    def observe(self, generation: int, rate: float) -> dict[str, Any] | None:
        """Feed one generation's success rate; return the change record, or None."""
        self._rates.append(float(rate))
        if len(self._rates) < self.window:
            return None
        while len(self._rates) > self.window:
            self._rates.popleft()
        mean = sum(self._rates) / len(self._rates)
        new = self.level
        if mean > self.raise_above and self.level < self.levels - 1:
            new = self.level + 1
        elif mean < self.lower_below and self.level > 0:
            new = self.level - 1
        if new == self.level:
            return None
        record = {
            "kind": "curriculum",
            "generation": generation,
            "from_level": self.level,
            "to_level": new,
            "success_rate": mean,
            "window": self.window,
        }
        self.level = new
        self._rates.clear()
        return record

    @classmethod
    def restore(cls, spec: CurriculumSettings, levels: int, level: int, history: list) -> Curriculum:
        """The curriculum (`curriculum` config, read by attribute) as of the end of
        `history`: a pure function of the success rates recorded there, so a resumed or
        forked run continues at the level it left; `level` is the task's starting level."""
        curriculum = cls(levels, level, spec.window, raise_above=spec.raise_above, lower_below=spec.lower_below)
        for record in history:
            if "success_rate" in record.extra:
                curriculum.observe(record.index, record.extra["success_rate"])
        return curriculum

    def settle(self, generation: int, members: list[Member]) -> dict[str, Any]:
        """Feed one generation's mean success rate; what its record's `extra` carries: the
        level it was scored at, the rate, and the change (`curriculum`) if the level moves."""
        rate = sum(m.success for m in members) / len(members)
        extra: dict[str, Any] = {"level": self.level, "success_rate": rate}
        change = self.observe(generation, rate)
        if change:
            extra["curriculum"] = change  # commits with the generation: the level's audit trail
        return extra

    def describe(self) -> dict[str, Any]:
        return {
            "levels": self.levels,
            "level": self.level,
            "window": self.window,
            "raise_above": self.raise_above,
            "lower_below": self.lower_below,
        }
