"""Length penalty: discourages completions longer than a budget (chars or words).

0 within the budget, falling linearly to ``-scale`` at twice the budget, never lower, so it
shapes without swamping the task reward.
"""

from __future__ import annotations

from typing import Any

from .answers import as_text
from .combine import RewardFn


def length_of(text: str, unit: str = "chars") -> int:
    if unit == "chars":
        return len(text)
    if unit == "words":
        return len(text.split())
    raise ValueError(f"length unit must be 'chars' or 'words', not {unit!r}")


def length_penalty(limit: int, unit: str = "chars", scale: float = 1.0) -> RewardFn:
    """A TRL-style reward function: ``-scale · min(1, max(0, len − limit) / limit)``."""
    if limit <= 0:
        raise ValueError("length limit must be positive")
    length_of("", unit)

    def reward(prompts: list[Any], completions: list[Any], **kwargs: Any) -> list[float | None]:
        out: list[float | None] = []
        for c in completions:
            excess = max(0, length_of(as_text(c), unit) - limit)
            out.append(-scale * min(1.0, excess / limit))
        return out

    reward.__name__ = "length_penalty"
    return reward
