"""Held-out reward of `RUN@G`, the objective of `tune` and the fitness of `pbt`.

A `HeldOut` keeps its own replica, rebuilt from the ledger (the source of truth), not the
training pool's weights: the trained run stays an ordinary run and the score is a function
of the ledger alone, so a resumed tuner scores exactly what an uninterrupted one did.
Scoring the next generation of the same run replays only the new records (each checked
against its recorded fingerprint); anything else is a rebuild from a kept copy of the base
(anchors used when present).
Decoding is greedy (`Evaluator.held_out_rewards`); rows are `rows` test rows after `skip`
(a module run's: its task's held-out seeds, `Evaluator.held_out_scores`); `rows` None: the
task's test rows, at most `DEFAULT_EVALUATION_ROWS` (`preflight.held_out_rows`, checked
before the model loads).
"""

from __future__ import annotations

from seedledger.engine.config import TrainConfig
from seedledger.engine.runtime.dirs import anchors_dir
from seedledger.engine.runtime.evaluator import Evaluator, HeldOutScores
from seedledger.engine.runtime.models import resolve_model
from seedledger.engine.runtime.preflight import held_out_rows
from seedledger.ledger import Ledger
from seedledger.ledger.errors import VerifyMismatch
from seedledger.replay import update
from seedledger.trainers.fitness import mean
from seedledger.trainers.tasks import load_task


class HeldOut:
    def __init__(self, cfg: TrainConfig, rows: int | None, skip: int = 0, owner: str = "objective"):
        task = load_task(cfg.task, seed=cfg.seed)
        self.rows, self.skip = held_out_rows(task, rows, skip, owner), skip  # before the model loads
        self.evaluator = Evaluator(cfg, resolve_model(cfg.model), task=task)
        # what a row is, and whether greedy decoding answers it (a module run's: a seed, no)
        self.unit: str = task.held_out_unit
        self.greedy = not task.scores_models
        self._base = {k: v.clone() for k, v in self.evaluator.master.items()}
        self._at: tuple[str, int] | None = None  # the (run, generation) the replica holds

    def score(self, ledger: Ledger, run: str, generation: int) -> float:
        """Mean held-out reward of `run@generation` (unscorable rows count 0)."""
        return mean(self.rewards(ledger, run, generation)) or 0.0

    def rewards(self, ledger: Ledger, run: str, generation: int) -> list[float]:
        """Per-row held-out rewards of `run@generation` (for paired comparisons)."""
        return [0.0 if r is None else r for r in self.scores(ledger, run, generation).rewards]

    def scores(self, ledger: Ledger, run: str, generation: int) -> HeldOutScores:
        """Row by row: `run@generation`'s greedy answers, rewards (None: unscorable) and components."""
        self._move(ledger, run, generation)
        return self.evaluator.held_out_scores(self.rows, self.skip)

    def _move(self, ledger: Ledger, run: str, generation: int) -> None:
        if self._at is not None and self._at[0] == run and self._at[1] <= generation:
            steps = ledger.replay_history(run, upto=generation)[self._at[1] :]
            expected = ledger.fingerprints(run, upto=generation)
            for step in steps:
                fp = self.evaluator.apply(step)
                if fp != expected.get(step.index):
                    raise VerifyMismatch(f"{run}@{step.index} does not replay to its fingerprint", step.index)
        else:
            if self._at is not None:  # restore replays onto the base: start from a copy of it
                self.evaluator.master = {k: v.clone() for k, v in self._base.items()}
                self.evaluator.state = update.OptimizerState()
            self.evaluator.restore(ledger, run, generation, anchors_dir(ledger))
        self._at = (run, generation)
