"""Format reward for the layout ``{think_start}…{think_end}…{answer_start}…{answer_end}``.

Any marker may be dropped (``None`` or ``""``). Full credit needs every marker exactly once,
in order, with only whitespace before the first and after the last; text between markers
is free. Otherwise partial credit in proportion to the markers found once and in order.
Scans with ``str.find``/``count`` only: linear time on any input (no backtracking regex).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from .answers import as_text
from .combine import RewardFn


def format_score(
    text: str, markers: Sequence[str], partial: float = 0.5
) -> float:
    """1.0 for the exact layout, else ``partial ×`` the fraction of markers in place."""
    if not markers:
        return 1.0
    pos = 0
    in_order = 0
    first_start = last_end = None
    for m in markers:
        if text.count(m) != 1:
            continue
        at = text.find(m)
        if at < pos:
            continue
        in_order += 1
        if first_start is None:
            first_start = at
        pos = at + len(m)
        last_end = pos
    if in_order == len(markers):
        assert first_start is not None and last_end is not None
        if not text[:first_start].strip() and not text[last_end:].strip():
            return 1.0
    return partial * in_order / len(markers)


def format_reward(
    think_start: str | None = "<think>",
    think_end: str | None = "</think>",
    answer_start: str | None = "<answer>",
    answer_end: str | None = "</answer>",
    partial: float = 0.5,
) -> RewardFn:
    """A TRL-style reward function scoring the layout (markers set to None are left out)."""
    markers = [m for m in (think_start, think_end, answer_start, answer_end) if m]

    def reward(prompts: list[Any], completions: list[Any], **kwargs: Any) -> list[float | None]:
        return [format_score(as_text(c), markers, partial) for c in completions]

    reward.__name__ = "format_reward"
    return reward
