"""Several tasks mixed with weights, reproducibly.

Each slot of a batch picks its task by a seeded draw from (seed, generation, slot), so over
many generations the mix follows the weights. Task ``i`` then takes its rows from its own
stream at positions ``generation·size …`` (stateless: no count of earlier draws needed).
Batch indices are offset by the sizes of the earlier tasks' pools, so they stay unique.
Rows carry ``_task`` (the task's position) so prompts and rewards go to the right task.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from seedledger.ledger.errors import SeedLedgerError

from .base import Messages, Task
from .sampling import mix64, stream, uniform


class MixtureTask(Task):
    """Tasks mixed by weight; same surface as ``Task``."""

    def __init__(self, tasks: Sequence[Task], weights: Sequence[float], seed: int = 0) -> None:
        if not tasks or len(tasks) != len(weights):
            raise SeedLedgerError("task mix: needs one weight per task and at least one task")
        if any(w < 0 for w in weights) or sum(weights) <= 0:
            raise SeedLedgerError("task mix: weights must be >= 0 with a positive sum")
        self.tasks = list(tasks)
        total = float(sum(weights))
        self.weights = [w / total for w in weights]
        self.name = "mix(" + ",".join(t.name for t in self.tasks) + ")"
        self.seed = seed
        self.levels = 1
        self.level = 0
        self.rewards = []
        known = [t.max_new_tokens for t in self.tasks if t.max_new_tokens]
        self.max_new_tokens = max(known) if known else None

    def train_rows(self) -> list[dict[str, Any]]:
        return [{**r, "_task": i} for i, t in enumerate(self.tasks) for r in t.train_rows()]

    def train_batch(
        self, seed: int, generation: int, size: int
    ) -> tuple[list[int], list[dict[str, Any]]]:
        if size <= 0:
            raise SeedLedgerError(f"task {self.name}: batch size must be positive, not {size}")
        counts = [0] * len(self.tasks)
        for slot in range(size):
            u = uniform(seed, 0x3117, generation, slot)
            acc = 0.0
            pick = len(self.tasks) - 1
            for i, w in enumerate(self.weights):
                acc += w
                if u < acc and w > 0:
                    pick = i
                    break
            counts[pick] += 1
        indices: list[int] = []
        rows: list[dict[str, Any]] = []
        offset = 0
        for i, (task, n) in enumerate(zip(self.tasks, counts, strict=True)):
            pool = task.train_rows()
            if n:
                picked = stream(len(pool), mix64(seed, i, task.level), generation * size, n)
                indices.extend(offset + j for j in picked)
                rows.extend({**pool[j], "_task": i} for j in picked)
            offset += len(pool)
        return indices, rows

    def test_rows(self) -> list[dict[str, Any]]:
        """Every task's test rows, interleaved by weight, so that any prefix (held-out
        evaluation scores ``test_rows()[:rows]``) holds each task in proportion to its
        weight. Deterministic: the next row comes from the task whose next row is due
        first, at ``(taken + 1) / weight`` (ties to the earlier task); a task whose rows run
        out drops out. Tasks of weight 0 follow at the end, in order."""
        pools = [t.test_rows() for t in self.tasks]
        taken = [0] * len(pools)
        out: list[dict[str, Any]] = []
        weighted = [i for i, w in enumerate(self.weights) if w > 0]
        while True:
            live = [i for i in weighted if taken[i] < len(pools[i])]
            if not live:
                break
            i = min(live, key=lambda j: ((taken[j] + 1) / self.weights[j], j))
            out.append({**pools[i][taken[i]], "_task": i})
            taken[i] += 1
        for i, w in enumerate(self.weights):
            if w <= 0:
                out.extend({**r, "_task": i} for r in pools[i])
        return out

    def prompt(self, row: dict[str, Any]) -> Messages:
        return self.tasks[row["_task"]].prompt(row)

    def reward(
        self, prompts: Sequence[Any], completions: Sequence[Any], rows: Sequence[dict[str, Any]]
    ) -> tuple[list[float], dict[str, list[float | None]]]:
        """Each sample scored by its own task; components of other tasks are None there."""
        n = len(rows)
        if not (len(prompts) == len(completions) == n):
            raise ValueError("prompts, completions and rows must have the same length")
        total = [0.0] * n
        components: dict[str, list[float | None]] = {}
        for i, task in enumerate(self.tasks):
            where = [j for j, r in enumerate(rows) if r["_task"] == i]
            if not where:
                continue
            rewards, comps = task.reward(
                [prompts[j] for j in where], [completions[j] for j in where], [rows[j] for j in where]
            )
            for k, j in enumerate(where):
                total[j] = rewards[k]
            for name, values in comps.items():
                column = components.setdefault(name, [None] * n)
                for k, j in enumerate(where):
                    column[j] = values[k]
        return total, components

    def objectives(self) -> dict[str, float]:
        """Every task's reward weights (a name two tasks share keeps the first task's)."""
        out: dict[str, float] = {}
        for task in self.tasks:
            for name, weight in task.objectives().items():
                out.setdefault(name, weight)
        return out

    def describe(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "seed": self.seed,
            "mix": [{"weight": w, **t.describe()} for t, w in zip(self.tasks, self.weights, strict=True)],
        }
