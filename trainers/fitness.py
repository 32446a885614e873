"""Reward semantics in one place: how a member's per-sample rewards become its fitness, and
how a generation's fitnesses are settled before the policy ranks them.

The engine decodes and asks the task to score each completion (`task.reward`: per sample
a combined reward, None where no reward function applies, and each function's
component); everything after that is here, so the engine implements no reward semantics:

    fitness = Fitness.of(cfg)                                    # per member
    member = fitness.score(member, rewards, components, seconds=..., logprobs=...)
    state = GenerationState.restore(cfg, task, history)          # per generation
    members, objectives, extra = state.settle(generation, members)

A member's `reward` is the mean of its samples' rewards (None left out, 0.0 when none
has one). With pass@k (`passk: {n, k}`), each prompt's n samples (prompt-major,
`per_sample`) count as successes at reward >= the pass@k threshold, and the reward is the
mean over prompts of the unbiased pass@k estimate (`rewards.passk`). `success` is the share
of samples at reward >= the curriculum's threshold (what the curriculum moves on), `kl`
the mean sequence KL to the base over the member's completions (`rewards.kl`). `settle`
then applies the KL penalty (reward − β·KL, β adapted) and feeds the curriculum, both
pure functions of the records (design.md invariant 11). Shaping and ranking are the
policy's (`trainers.shaping`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from seedledger.trainers.member import Member
from seedledger.trainers.rewards.curriculum import Curriculum, success_rate
from seedledger.trainers.rewards.kl import KLPenalty, sequence_kl
from seedledger.trainers.rewards.passk import PassKSettings, pass_at_k_rewards, samples_per_prompt
from seedledger.trainers.settings import TrainSettings

T = TypeVar("T")


def mean(values: Sequence[float | None]) -> float | None:
    """The mean of the values that are not None (None: no reward applies), None if none is."""
    kept = [v for v in values if v is not None]
    return sum(kept) / len(kept) if kept else None


@dataclass(frozen=True)
class Fitness:
    """A run's per-member reward semantics (the module docstring), from its config."""

    passk: PassKSettings | None = None  # the `passk` config section (n, k, threshold), or None
    threshold: float = 1.0  # success: reward >= this (`curriculum.threshold`, else 1.0)
    kl: str | None = None  # the KL estimator when the run has a `kl` penalty
    row_scores: bool = True  # keep each batch row's score (ledger.rowscores)

    @classmethod
    def of(cls, cfg: TrainSettings) -> Fitness:
        """The semantics `cfg` (the engine's TrainConfig, read by attribute) sets."""
        return cls(cfg.passk, cfg.curriculum.threshold if cfg.curriculum else 1.0,
                   cfg.kl.estimator if cfg.kl is not None else None, cfg.row_scores)

    @property
    def samples(self) -> int:
        """Completions drawn per prompt: pass@k's n, else 1."""
        return samples_per_prompt(self.passk)

    def per_sample(self, items: Sequence[T]) -> list[T]:
        """One entry per completion: each prompt's item repeated `samples` times (prompt-major)."""
        return [item for item in items for _ in range(self.samples)]

    def score(
        self, member: Member, rewards: Sequence[float | None], components: dict[str, list[float | None]], *,
        samples: list[dict[str, Any]] | None = None, seconds: dict[str, float] | None = None,
        logprobs: Sequence[tuple[Sequence[float], Sequence[float]]] | None = None,
    ) -> Member:
        """`member` scored from its samples' `rewards` and reward `components` (per sample, in
        `per_sample` order); `logprobs`: per completion, the member's and the base's token
        log-probabilities (the KL penalty's input)."""
        scores = [0.0 if r is None else r for r in rewards]
        means = {name: mean(values) for name, values in components.items()}
        reward = mean(rewards) or 0.0
        rows = [math.nan if r is None else r for r in rewards]  # reward: their mean (ledger.rowscores)
        if self.passk is not None:
            threshold = self.threshold if self.passk.threshold is None else self.passk.threshold
            per_prompt = pass_at_k_rewards(scores, self.passk.n, self.passk.k, threshold)[:: self.passk.n]
            means["sample_reward"] = reward
            reward = sum(per_prompt) / len(per_prompt)
            means[f"pass@{self.passk.k}"] = reward
            rows = per_prompt
        kl = None
        if logprobs is not None and self.kl is not None:
            kls = [sequence_kl(mine, base, self.kl) for mine, base in logprobs]
            kl = sum(kls) / len(kls)
        return member.scored(
            reward=reward, components=means, samples=samples, seconds=dict(seconds or {}),
            success=success_rate(scores, self.threshold), kl=kl, sample_rewards=scores,
            row_scores=rows if self.row_scores else None,
        )


@dataclass
class GenerationState:
    """The state the rewards carry from one generation to the next: the KL penalty's β
    (`kl`) and the curriculum's level (`curriculum`); `objectives` is the task's
    `objectives` method (the reward weights a Pareto shaping ranks by)."""

    objectives: Callable[[], dict[str, float]]
    kl: KLPenalty | None = None
    curriculum: Curriculum | None = None

    @classmethod
    def restore(cls, cfg: TrainSettings, task: Any, history: list) -> GenerationState:
        """The state after `history` for config `cfg` (read by attribute) and the task."""
        kl = None
        if cfg.kl is not None:
            kl = KLPenalty.restore(cfg.kl, cfg.batch_size, samples_per_prompt(cfg.passk), history)
        curriculum = None
        if cfg.curriculum is not None:
            curriculum = Curriculum.restore(cfg.curriculum, task.levels, task.level, history)
        return cls(task.objectives, kl, curriculum)

    @property
    def level(self) -> int | None:
        """The difficulty level the next batch is drawn at (None: no curriculum)."""
        return self.curriculum.level if self.curriculum else None

    def settle(self, generation: int, members: list[Member]) -> tuple[list[Member], dict[str, float], dict]:
        """(members as the policy ranks them: KL-penalised rewards, reward weights, the
        record's `extra`) for one scored generation; advances β and the curriculum."""
        objectives, extra = dict(self.objectives()), {}
        if self.kl is not None:
            objectives["kl"] = -self.kl.beta  # Pareto shaping: a smaller KL is better
            members, extra["kl"] = self.kl.penalise(members)
        if self.curriculum is not None:
            extra |= self.curriculum.settle(generation, members)
        return members, objectives, extra


__all__ = ["Fitness", "GenerationState", "mean"]
