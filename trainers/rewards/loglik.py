"""`loglik`: dense likelihood fitness — how probable a row's reference answer is under a member.

For each row the reference completion is the entry's `template` with ``{answer}`` replaced
by the row's answer cell (default ``<answer>{answer}</answer>``), followed by the model's
end-of-turn token, so the member is also rewarded for stopping after the answer. The
backend scores it by teacher forcing, with no decoding:

    loglik(row) = (1/|y|) · Σ_t log π(y_t | prompt, y_<t)        (nats per token, ≤ 0)

and a member's component is the mean over the batch's rows. Unlike a decoded reward it
moves with every member's weights, however small σ is, so no generation ties (issue 30,
zeroth-order supervised fine-tuning as in MeZO, Malladi et al. 2023). It is a training
signal, not a verdict: held-out rows are still decoded greedily and scored by the
completion rewards (the task's own when the list holds only `loglik`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from seedledger.ledger.errors import SeedLedgerError

DEFAULT_TEMPLATE = "<answer>{answer}</answer>"


@dataclass(frozen=True)
class LikelihoodReward:
    """One `loglik` entry of a task's reward list: component `name`, its weight, and how a
    row's reference completion is written."""

    name: str
    weight: float = 1.0
    template: str = DEFAULT_TEMPLATE
    column: str = "answer"

    def reference(self, row: dict[str, Any]) -> str:
        """The completion the member should give for `row` (end-of-turn token not included)."""
        cell = row.get(self.column)
        if cell is None or isinstance(cell, dict | list):
            raise SeedLedgerError(
                f"reward {self.name!r}: a row has no text in column {self.column!r} to score "
                f"(columns: {', '.join(sorted(k for k in row if not k.startswith('_')))})"
            )
        return self.template.replace("{answer}", str(cell))

    def references(self, rows: Sequence[dict[str, Any]]) -> list[str]:
        return [self.reference(row) for row in rows]

    def describe(self) -> dict[str, Any]:
        return {"name": self.name, "weight": self.weight, "loglik": {"template": self.template,
                                                                    "column": self.column}}


def mean_logprob(token_logprobs: Sequence[float]) -> float:
    """A reference's score from its tokens' log-probabilities (an empty one cannot occur:
    the end-of-turn token is always scored)."""
    if not token_logprobs:
        raise ValueError("a reference completion has at least its end-of-turn token")
    return sum(token_logprobs) / len(token_logprobs)
