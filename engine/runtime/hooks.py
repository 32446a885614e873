"""What the training loop tells its watchers (the CLI's progress, evaluation.every, tune's
pruning): callbacks only, so a watcher imports this and not the loop."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from seedledger.ledger import GenerationRecord
    from seedledger.trainers.member import Member


@dataclass
class Hooks:
    """Progress callbacks; the CLI draws a progress bar from them, tests ignore them."""

    on_generation_start: Callable[[int, int], None] = lambda generation, members: None
    on_member: Callable[[Member], None] = lambda member: None  # a scored member (`Member.reward`)
    on_generation_end: Callable[[GenerationRecord, float], None] = lambda record, seconds: None
    on_notice: Callable[[str, str], None] = lambda level, message: None  # level: note | warning
    # asked after each committed generation: True ends the session there (a pruned trial)
    should_stop: Callable[[], bool] = lambda: False
