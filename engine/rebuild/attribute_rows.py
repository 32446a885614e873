"""A generation's coefficients without one training row: the replay counterfactual's input.

Each member's reward is the mean of its stored row scores (ledger.rowscores); leaving row r
out of that mean gives the rewards the generation would have had without r in its batch,
and ES's own `coefficients` (the same shaping, the σ and lr the record applied, the same
12-bit rounding) turns them into the coefficients it would have applied. Later
generations keep their recorded coefficients: the question is what r did through the
generations that saw it, not what a retrained run would have done after (that is the
retrain counterfactual, `attribute_retrain`).

Before any counterfactual, every generation's recorded coefficients must follow from its
stored scores bit for bit (`check`): a history whose coefficients the scores do not explain
(another algorithm, Pareto shaping, a KL penalty, edited rows) is refused in one line, not
attributed approximately.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from seedledger.engine.config import TrainConfig, validate
from seedledger.ledger import GenerationRecord, Ledger
from seedledger.ledger.errors import SeedLedgerError
from seedledger.ledger.rowscores import member_reward
from seedledger.trainers.es import ES
from seedledger.trainers.member import Member


@dataclass(frozen=True)
class Generation:
    """One recorded generation as the counterfactual needs it: its record and the ES
    policy (shaping, mirrored) of the run that trained it."""

    record: GenerationRecord
    policy: ES

    def coefficients(self, without: int | None = None) -> list[float]:
        """The coefficients from the stored scores, leaving out every occurrence of
        training row `without` (None: all rows, which must give the recorded ones)."""
        rec = self.record
        keep = [j for j, i in enumerate(rec.batch_indices) if i != without]
        rewards = [member_reward([m.row_scores[j] for j in keep]) for m in rec.members]
        members = [Member(m.index, m.key, m.sign) for m in rec.members]
        folds = (rec.optimizer or {}).get("name") == "sgd"  # SGD carries lr in its coefficients
        # rec.sigma: the σ the record applied (`difference` shaping divides by it)
        return self.policy.coefficients(members, rewards, (rec.lr if folds else 1.0) / len(members), rec.sigma)


def refusal(cfg: TrainConfig) -> str | None:
    """Why a run's coefficients cannot be recomputed without a row (None: they can)."""
    if cfg.algorithm != "es":
        return f"algorithm {cfg.algorithm} (only ES's coefficients are a function of the rewards alone)"
    if cfg.shaping == "pareto":
        return "shaping pareto (its ranks use reward components, which are not kept per row)"
    if cfg.kl is not None:
        return "a KL penalty (its term is per member, not per row)"
    if cfg.curriculum is not None:
        return "a curriculum (a row index means another row at each level)"
    return None


def generations(ledger: Ledger, run: str, upto: int) -> list[Generation]:
    """Generations 1..upto of `run`'s lineage with their runs' policies, each checked: its
    scores are stored and give back its recorded coefficients exactly."""
    configs: dict[str, Any] = {}
    out = []
    segments = ledger.ancestors(run, upto)
    records = ledger.records(run, upto=upto)
    for rec in records:
        holder = next(name for name, first, last in segments if first <= rec.index <= last)
        if holder not in configs:
            cfg = validate(ledger.get_run(holder).config, f"run {holder} config")
            why = refusal(cfg)
            if why is not None:
                raise SeedLedgerError(f"attribute: run {holder} trains with {why}: its generations cannot be "
                                      "re-weighted without a row")
            configs[holder] = cfg
        cfg = configs[holder]
        out.append(Generation(rec, ES(rec.population, mirrored=cfg.mirrored, shaping=cfg.shaping)))
    missing = [g.record.index for g in out if any(m.row_scores is None for m in g.record.members)]
    if missing:
        raise SeedLedgerError(
            f"attribute: {run}'s generations {_span(missing)} keep no row scores (trained with row_scores: false, "
            "before schema 0008, or imported): training rows cannot be attributed")
    for g in out:
        recorded = [m.coefficient for m in g.record.members]
        if g.coefficients() != recorded:
            raise SeedLedgerError(f"attribute: generation {g.record.index}'s recorded coefficients do not follow "
                                  "from its row scores: the history cannot be re-weighted exactly")
    return out


def seen(history: list[Generation]) -> dict[int, list[int]]:
    """Training row → the generations whose batch held it, in first-seen order."""
    out: dict[int, list[int]] = {}
    for g in history:
        for row in dict.fromkeys(g.record.batch_indices):
            out.setdefault(row, []).append(g.record.index)
    return out


def without(history: list[Generation], row: int) -> dict[int, list[float]]:
    """The replaced coefficients of every generation that saw `row`, without it."""
    return {g.record.index: g.coefficients(row) for g in history if row in g.record.batch_indices}


def _span(indices: list[int]) -> str:
    return f"{indices[0]}..{indices[-1]}" if len(indices) > 1 else str(indices[0])
