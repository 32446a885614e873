"""The Task: rows, a deterministic split and batches, a chat prompt, and weighted rewards.

This is the surface the engine calls (docs/internals.md, trainers/):
``train_batch(seed, generation, size) -> (indices, rows)``, ``test_rows()``,
``prompt(row) -> messages``, ``reward(prompts, completions, rows) -> (rewards, components)``,
``name``, ``describe()``. Rewards are completion rewards (functions of decoded text) and
likelihood rewards (``loglik``: the reference answer scored by the backend, passed to
``reward`` as ``likelihoods``); ``decodes`` says whether training needs completions at all.
Tasks with difficulty levels (the generators) also honour ``set_level`` so a ``Curriculum``
can move them.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from seedledger.ledger.errors import SeedLedgerError
from seedledger.trainers.rewards.combine import WeightedReward, combine
from seedledger.trainers.rewards.loglik import LikelihoodReward

from .sampling import mix64, stream

Messages = list[dict[str, str]]


def chat(system: str | None, user: str) -> Messages:
    """Chat messages for one prompt (system message left out when empty)."""
    msgs = [{"role": "system", "content": system}] if system else []
    msgs.append({"role": "user", "content": user})
    return msgs


def columns_of(rows: Sequence[dict[str, Any]]) -> dict[str, list[Any]]:
    """Rows as TRL-style keyword columns: every key but ``prompt`` and internal ``_`` keys
    (a row without a key gets None there)."""
    keys: list[str] = []
    for row in rows:
        for k in row:
            if k != "prompt" and not k.startswith("_") and k not in keys:
                keys.append(k)
    return {k: [row.get(k) for row in rows] for k in keys}


def as_conversation(completion: Any) -> Any:
    """A generated string in TRL's conversational completion form (prompts are chats)."""
    if isinstance(completion, str):
        return [{"role": "assistant", "content": completion}]
    return completion


class Task:
    """A dataset with a fixed split, a prompt format and its reward functions."""

    scores_models = False  # it scores completions (fitness_task.ModelTask scores modules)
    held_out_unit = "rows"  # what a held-out row is, as `evaluate`'s report names it

    def __init__(
        self,
        name: str,
        train: Callable[[int], list[dict[str, Any]]] | list[dict[str, Any]],
        test: list[dict[str, Any]],
        prompt: Callable[[dict[str, Any]], Messages],
        rewards: list[WeightedReward | LikelihoodReward],
        *,
        seed: int = 0,
        levels: int = 1,
        level: int = 0,
        max_new_tokens: int | None = None,
        info: dict[str, Any] | None = None,
    ) -> None:
        self.name = name
        self._train = train
        self._pools: dict[int, list[dict[str, Any]]] = {}
        self._test = test
        self._prompt = prompt
        self.rewards = rewards
        self.own_rewards = list(rewards)  # the task's answer check, whatever a config's list says
        self.seed = seed
        self.levels = levels
        self.level = level
        self.max_new_tokens = max_new_tokens
        self.info = info or {}
        if not test:
            raise SeedLedgerError(f"task {name}: test split is empty")
        if not self.train_rows():
            raise SeedLedgerError(f"task {name}: train split is empty")

    def set_level(self, level: int) -> None:
        """Move to difficulty ``level`` (training rows only; the test split stays fixed)."""
        if not 0 <= level < self.levels:
            raise SeedLedgerError(f"task {self.name}: level {level} outside 0..{self.levels - 1}")
        self.level = level

    def train_rows(self) -> list[dict[str, Any]]:
        """The training pool at the current level."""
        if self.level not in self._pools:
            pool = self._train(self.level) if callable(self._train) else self._train
            self._pools[self.level] = pool
        return self._pools[self.level]

    def train_batch(
        self, seed: int, generation: int, size: int
    ) -> tuple[list[int], list[dict[str, Any]]]:
        """Rows for ``generation``: positions ``generation·size …`` of a seeded stream of
        epoch permutations of the pool, so it depends only on (seed, generation, size, level)."""
        if size <= 0:
            raise SeedLedgerError(f"task {self.name}: batch size must be positive, not {size}")
        pool = self.train_rows()
        indices = stream(len(pool), mix64(seed, self.level), generation * size, size)
        return indices, [pool[i] for i in indices]

    def test_rows(self) -> list[dict[str, Any]]:
        return list(self._test)

    @property
    def held_out_size(self) -> int:
        """How many held-out rows there are (`evaluate`, `evaluation.every`, tune objectives)."""
        return len(self.test_rows())

    def prompt(self, row: dict[str, Any]) -> Messages:
        return self._prompt(row)

    @property
    def likelihood_rewards(self) -> list[LikelihoodReward]:
        return [r for r in self.rewards if isinstance(r, LikelihoodReward)]

    @property
    def decodes(self) -> bool:
        """Whether a member's reward needs its completions (not when every reward is a
        likelihood: training then runs teacher-forced forwards only)."""
        return not self.rewards or len(self.likelihood_rewards) < len(self.rewards)

    def reward(
        self, prompts: Sequence[Any], completions: Sequence[Any], rows: Sequence[dict[str, Any]],
        likelihoods: dict[str, list[float]] | None = None,
    ) -> tuple[list[float], dict[str, list[float | None]]]:
        """Combined reward per completion and each function's values (TRL calling convention;
        completions are passed in conversational form because prompts are chats).
        `likelihoods`: each likelihood reward's per-row scores (component name → values)."""
        if not (len(prompts) == len(completions) == len(rows)):
            raise ValueError("prompts, completions and rows must have the same length")
        convo = [as_conversation(c) for c in completions]
        functions = [r for r in self.rewards if isinstance(r, WeightedReward)]
        total, components = combine(functions, prompts, convo, columns_of(rows))
        for r in self.likelihood_rewards:
            values = (likelihoods or {}).get(r.name)
            if values is None or len(values) != len(rows):
                raise ValueError(f"reward {r.name!r}: one likelihood per row is needed")
            components[r.name] = list(values)
            total = [t + r.weight * v for t, v in zip(total, values, strict=True)]
        ordered = {r.name: components[r.name] for r in self.rewards}  # the config's order
        return total, ordered

    def held_out_reward(
        self, prompts: Sequence[Any], completions: Sequence[Any], rows: Sequence[dict[str, Any]]
    ) -> tuple[list[float], dict[str, list[float | None]]]:
        """Greedy held-out answers scored by the completion rewards (the task's own answer
        check when training uses likelihood rewards only): a held-out figure is a verdict on
        decoded text, comparable between runs trained on any fitness."""
        if not self.likelihood_rewards:
            return self.reward(prompts, completions, rows)
        functions = [r for r in self.rewards if isinstance(r, WeightedReward)] or self.own_rewards
        convo = [as_conversation(c) for c in completions]
        return combine(functions, prompts, convo, columns_of(rows))

    def objectives(self) -> dict[str, float]:
        """Component name → weight of every reward function (Pareto shaping's objectives)."""
        return {r.name: r.weight for r in self.rewards}

    def describe(self) -> dict[str, Any]:
        """JSON-able identity of the task, written to the ledger with the run."""
        return {
            "name": self.name,
            "seed": self.seed,
            "train_size": len(self.train_rows()),
            "test_size": len(self._test),
            "levels": self.levels,
            "level": self.level,
            "max_new_tokens": self.max_new_tokens,
            "rewards": [r.describe() for r in self.rewards],
            **self.info,
        }
