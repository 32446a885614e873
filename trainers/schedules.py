"""Learning-rate and sigma schedules: the value in force at a generation.

The value a schedule yields is recorded per generation in the ledger, so replay never
re-evaluates a schedule: changing this code cannot change an existing history.
"""

from __future__ import annotations

import math
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator


class Schedule(BaseModel):
    """`constant`, `linear_warmup` (0 → base over `warmup` generations) or `cosine`
    (warm-up, then cosine decay to `final_ratio`·base at `total` generations)."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    @model_validator(mode="before")
    @classmethod
    def _from_name(cls, value):
        """A bare name is shorthand: `schedule.lr: cosine` means `{name: cosine}`."""
        return {"name": value} if isinstance(value, str) else value

    name: Literal["constant", "linear_warmup", "cosine"] = Field("constant", description="The schedule's shape.")
    warmup: int = Field(0, ge=0, le=1 << 20, description="Generations of linear warm-up from 0 to the base value.")
    total: int | None = Field(
        None, ge=1, le=1 << 20,
        description="cosine: the generation at which the decay ends (default: the run's `generations`).",
    )
    final_ratio: float = Field(
        0.0, ge=0.0, le=1.0, description="cosine: the value at `total`, as a fraction of the base value."
    )

    def factor(self, generation: int, total_generations: int) -> float:
        """Multiplier of the base value at 1-based `generation`."""
        if self.name == "constant":
            return 1.0
        if self.warmup and generation <= self.warmup:
            return generation / self.warmup
        if self.name == "linear_warmup":
            return 1.0
        total = self.total or total_generations
        span = max(total - self.warmup, 1)
        progress = min(max(generation - self.warmup, 0) / span, 1.0)
        cosine = 0.5 * (1.0 + math.cos(math.pi * progress))
        return self.final_ratio + (1.0 - self.final_ratio) * cosine
