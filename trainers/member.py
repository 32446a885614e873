"""One member of a generation, one record type from `Policy.ask` to the commit.

A policy names a member (its noise key, sign and, for LM-MA-ES or a GA's survivors, its
terms along the replay state's paths); evaluation fills in what scoring it found (reward,
components, samples, timings, success rate, KL, per-sample rewards) on the *same* type
(`scored`), locally or in a Ray worker; the policy's `Decision` gives it a coefficient and
`record` turns it into the ledger's `MemberRecord` at the commit. So a member changes
shape only where it leaves this layer: the backend's batch columns, the ledger's record.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from seedledger.ledger.records import MemberRecord


@dataclass(frozen=True)
class Member:
    """weights = master + round(sign·σ·shrink)·ε(key) + Σⱼ pathsⱼ·Mⱼ (`replay.paths`), and,
    once evaluated, what its completions scored on the generation's batch."""

    index: int
    key: int
    sign: int
    shrink: float = 1.0
    paths: tuple[float, ...] = ()
    # -- filled in by evaluation (`scored`); None/empty while the member is only asked for
    reward: float | None = None
    components: dict[str, float | None] = field(default_factory=dict)
    samples: list[dict[str, Any]] | None = None
    seconds: dict[str, float] = field(default_factory=dict)
    success: float = 0.0  # share of the batch's samples at reward >= the curriculum threshold
    kl: float | None = None  # mean KL(member ‖ base) per completion, with the `kl` penalty
    sample_rewards: list[float] | None = None  # per completion (a GA's speciation compares them)
    row_scores: list[float] | None = None  # per batch row, their mean the reward (ledger.rowscores)

    def scored(self, **score: Any) -> Member:
        """This member with what evaluating it found (the fields after `paths`)."""
        return replace(self, **score)

    def record(self, coefficient: float) -> MemberRecord:
        """The ledger's record of this scored member, with the coefficient the policy decided."""
        if self.reward is None:
            raise ValueError(f"member {self.index} was not evaluated")
        return MemberRecord(
            index=self.index, key=self.key, sign=self.sign, reward=self.reward, coefficient=coefficient,
            components=self.components, samples=self.samples, row_scores=self.row_scores,
        )


__all__ = ["Member"]
