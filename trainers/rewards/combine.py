"""Weighted combination of TRL-GRPO-style reward functions, keeping each function's values.

A reward function is ``fn(prompts, completions, **columns) -> list[float | None]`` (TRL's
GRPO convention: every dataset column arrives as a keyword list; ``None`` means "does not
apply to this sample"). The combined reward is ``Σ w·r`` over the functions that apply
(TRL's nansum; 0.0 when none applies). The per-function values are returned as well, so
the engine can store them per member in the ledger.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from seedledger.ledger.errors import SeedLedgerError

RewardFn = Callable[..., list[float | None]]


@dataclass(frozen=True)
class WeightedReward:
    """One reward function in a task: the component ``name`` recorded in the ledger."""

    name: str
    fn: RewardFn
    weight: float = 1.0

    def describe(self) -> dict[str, Any]:
        return {"name": self.name, "weight": self.weight}


def call_reward(
    reward: WeightedReward, prompts: Sequence[Any], completions: Sequence[Any], columns: dict
) -> list[float | None]:
    """Call one function and check its answer: one finite float or None per completion."""
    try:
        values = reward.fn(prompts=list(prompts), completions=list(completions), **columns)
    except SeedLedgerError:
        raise
    except Exception as exc:  # a user function's bug is bad input for the run
        raise SeedLedgerError(
            f"reward function {reward.name!r} raised {type(exc).__name__}: {exc}".splitlines()[0]
        ) from exc
    if not isinstance(values, list | tuple) or len(values) != len(completions):
        got = len(values) if isinstance(values, list | tuple) else type(values).__name__
        raise SeedLedgerError(
            f"reward function {reward.name!r} returned {got} values for {len(completions)} completions"
        )
    out: list[float | None] = []
    for v in values:
        if v is None:
            out.append(None)
            continue
        if isinstance(v, bool) or not isinstance(v, int | float):
            try:
                v = float(v)  # numpy / torch scalars
            except (TypeError, ValueError):
                raise SeedLedgerError(
                    f"reward function {reward.name!r} returned a {type(v).__name__}, not a number"
                ) from None
        v = float(v)
        out.append(None if math.isnan(v) else v)
    return out


def combine(
    rewards: Sequence[WeightedReward],
    prompts: Sequence[Any],
    completions: Sequence[Any],
    columns: dict[str, list],
) -> tuple[list[float], dict[str, list[float | None]]]:
    """Return (combined reward per completion, {component name: values per completion})."""
    components: dict[str, list[float | None]] = {}
    total = [0.0] * len(completions)
    for reward in rewards:
        values = call_reward(reward, prompts, completions, columns)
        components[reward.name] = values
        for i, v in enumerate(values):
            if v is not None:
                total[i] += reward.weight * v
    return total, components


def mean_components(components: dict[str, list[float | None]]) -> dict[str, float | None]:
    """Mean of each component over the samples where it applies (None if nowhere)."""
    out: dict[str, float | None] = {}
    for name, values in components.items():
        present = [v for v in values if v is not None]
        out[name] = sum(present) / len(present) if present else None
    return out
