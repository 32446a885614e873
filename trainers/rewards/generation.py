"""The state the rewards carry from one generation to the next, behind one surface.

The curriculum's level (`curriculum`), the KL penalty's β (`kl`) and pass@k's samples per
prompt (`passk`) each live beside their reward; the loop sees only this:

    state = GenerationState.restore(cfg, task, history)   # a pure function of the records
    batch = pool.batch(generation, state.level)
    members, objectives, extra = state.settle(generation, scored)   # before `tell`

`settle` returns the members as the policy ranks them (KL-penalised rewards), the reward
weights a Pareto shaping ranks by, and what the generation's record carries in `extra`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from seedledger.trainers.member import Member
from seedledger.trainers.rewards.curriculum import Curriculum
from seedledger.trainers.rewards.kl import KLPenalty
from seedledger.trainers.rewards.passk import samples_per_prompt


@dataclass
class GenerationState:
    """See the module docstring; `objectives` is the task's `objectives` method."""

    objectives: Callable[[], dict[str, float]]
    kl: KLPenalty | None = None
    curriculum: Curriculum | None = None

    @classmethod
    def restore(cls, cfg: Any, task: Any, history: list) -> GenerationState:
        """The state after `history` for config `cfg` (read by attribute) and the task."""
        kl = None
        if cfg.kl is not None:
            kl = KLPenalty.restore(cfg.kl, cfg.batch_size, samples_per_prompt(cfg.passk), history)
        curriculum = None
        if cfg.curriculum is not None:
            curriculum = Curriculum.restore(cfg.curriculum, task.levels, task.level, history)
        return cls(task.objectives, kl, curriculum)

    @property
    def level(self) -> int | None:
        """The difficulty level the next batch is drawn at (None: no curriculum)."""
        return self.curriculum.level if self.curriculum else None

    def settle(self, generation: int, members: list[Member]) -> tuple[list[Member], dict[str, float], dict]:
        """(members as ranked, reward weights, the record's `extra`) for one scored generation;
        advances β and the curriculum."""
        objectives, extra = dict(self.objectives()), {}
        if self.kl is not None:
            objectives["kl"] = -self.kl.beta  # Pareto shaping: a smaller KL is better
            members, extra["kl"] = self.kl.penalise(members)
        if self.curriculum is not None:
            extra |= self.curriculum.settle(generation, members)
        return members, objectives, extra


__all__ = ["GenerationState"]
