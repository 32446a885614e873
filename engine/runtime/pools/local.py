"""The in-process pool: one replica evaluates the whole population, in member order."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from seedledger.engine.config import TrainConfig
from seedledger.engine.runtime.failpoints import failpoint
from seedledger.engine.runtime.scoring.evaluator import Batch, Evaluator
from seedledger.ledger import Ledger, ReplayStep
from seedledger.trainers.member import Member


class LocalPool:
    def __init__(self, cfg: TrainConfig, model_dir: Path):
        self.replica = Evaluator(cfg, model_dir)
        self.task = self.replica.task
        self._fingerprint: str | None = None

    def base_fingerprint(self) -> str:
        return self.replica.base_fingerprint()

    def fingerprint(self) -> str:
        """The master's fingerprint as of the last restore or apply."""
        if self._fingerprint is None:
            self._fingerprint = self.base_fingerprint()
        return self._fingerprint

    def restore(self, ledger: Ledger, run: str, generation: int, anchors_dir: Path | None) -> str:
        self._fingerprint = self.replica.restore(ledger, run, generation, anchors_dir)
        return self._fingerprint

    def batch(self, generation: int, level: int | None = None) -> Batch:
        """The generation's batch, built once: the loop records its indices, members score it."""
        return self.replica.batch(generation, level)

    def evaluate(
        self,
        members: list[Member],
        sigma: float,
        generation: int,
        run_key: int,
        batch: Batch,
        on_member: Callable[[Member], None] | None = None,
        heartbeat: Callable[[], None] | None = None,
    ) -> list[Member]:
        """The whole population scored on the one replica, group after group, in member
        order (`on_member` after each group renews the lease; `heartbeat` is not needed here)."""
        return self.replica.score_population(members, sigma, generation, run_key, on_member=on_member, batch=batch)

    def apply(self, step: ReplayStep) -> str:
        failpoint("update", step.index)
        self._fingerprint = self.replica.apply(step)
        failpoint("updated", step.index)
        return self._fingerprint

    def held_out_reward(self, limit: int) -> float:
        return self.replica.held_out_reward(limit)

    def state(self):
        return self.replica.master, self.replica.state

    def close(self) -> None:
        pass
