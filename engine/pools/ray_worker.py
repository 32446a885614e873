"""The Ray actor behind `RayPool`: one model replica in its own process.

Arguments and results are plain numbers, strings and dicts (member keys and signs, σ,
generation, coefficients, rewards, fingerprints), so the cost of a call does not grow
with the model: the weights stay in the actor, which replays every record itself.
Only `state()` returns tensors (anchors and session ends, not per generation).
"""

from __future__ import annotations

import os
from dataclasses import asdict
from pathlib import Path
from typing import Any

from engine.config import TrainConfig
from engine.evaluator import Evaluator
from ledger import Ledger, ReplayStep
from trainers.es import Member


def step_to_wire(step: ReplayStep) -> dict[str, Any]:
    """A replay step as plain data (what crosses the process boundary)."""
    return {
        "run": step.run,
        "index": step.index,
        "keys": list(step.keys),
        "coefficients": list(step.coefficients),
        "sigma": step.sigma,
        "optimizer": dict(step.optimizer),
    }


class ReplicaActor:
    """One `Evaluator` (base model loaded once, own fp32 master and optimizer state)."""

    def __init__(self, cfg: dict[str, Any], model_dir: str, threads: int):
        import torch

        # Ray sets OMP_NUM_THREADS only for whole CPUs; size torch's pool explicitly so
        # that W actors on W cores do not oversubscribe them.
        torch.set_num_threads(max(1, threads))
        try:  # replay's CPU kernels are numba-parallel: same budget
            import numba

            numba.set_num_threads(min(max(1, threads), numba.config.NUMBA_NUM_THREADS))
        except ImportError:
            pass
        self.replica = Evaluator(TrainConfig.model_validate(cfg), Path(model_dir))

    def pid(self) -> int:
        """The process id (tests SIGKILL it to exercise recovery)."""
        return os.getpid()

    def base_fingerprint(self) -> str:
        return self.replica.base_fingerprint()

    def restore(self, url: str, run: str, generation: int, anchors_dir: str | None) -> str:
        """Rebuild `run@generation` from the ledger; this actor only reads it."""
        ledger = Ledger.open(url, upgrade=False, create=False)
        try:
            anchors = Path(anchors_dir) if anchors_dir else None
            return self.replica.restore(ledger, run, generation, anchors)
        finally:
            ledger.close()

    def score(
        self,
        member: tuple[int, int, int],
        sigma: float,
        generation: int,
        run_key: int,
        level: int | None = None,
    ) -> dict[str, Any]:
        index, key, sign = member
        result = self.replica.score(Member(index, key, sign), sigma, generation, run_key, level)
        return asdict(result)

    def apply(self, step: dict[str, Any]) -> str:
        return self.replica.apply(ReplayStep(**step))

    def held_out_reward(self, limit: int) -> float:
        return self.replica.held_out_reward(limit)

    def state(self):
        return self.replica.master, self.replica.state
