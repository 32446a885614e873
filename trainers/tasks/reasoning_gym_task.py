"""``reasoning_gym:NAME``: any procedural generator of the ``reasoning-gym`` library, scored
by the library's own ``score_answer``.

Rows are made and scored inside the sandbox (``trainers.sandbox``), never here: several
of the library's scorers ``eval`` the model's answer (string_insertion, n_queens, …) or
hand it to sympy's ``parse_expr``, and a few generators depend on Python's string hash
order (word_ladder), which the sandbox fixes (``PYTHONHASHSEED=0``) so every process
makes the same rows. Rows are made on demand, in blocks, and cached: a generator such as
zebra_puzzles takes about half a second per puzzle, so only the rows a batch or the
held-out evaluation reads are ever made. The generator itself is first built in a caged
item under the task's ``memory_mb`` (and 60 CPU-s or ``cpu_seconds``, whichever is more),
since its ``options`` may come from a stranger's stored config (``resume``,
``evaluate``): options that do not fit are refused in one line at load.

Splits: the test split is the generator's items ``0 … test_size−1`` under the seed
``mix64(data_seed, TEST)``, the training pool items ``0 … train_size−1`` under
``mix64(data_seed, TRAIN)``; batches are drawn from the pool by the run's seed like every
other task (``Task.train_batch``). A small problem space can repeat a test problem in the
pool (the library's own train/eval convention: different seeds, no deduplication).

Prompt and answer: the library's ``default`` system prompt (think, then the final answer
inside ``<answer></answer>``) and the item's question as the user message. The model's
answer is the text between the last ``<answer>`` and the first ``</answer>`` after it
(it may span lines, as the library's ``extract_answer`` allows), stripped; without one
(or over ``MAX_ANSWER_CHARS``) the answer is None, which the library scores 0. The score
(0…1, partial credit where the library gives it) is clamped to [0, 1]; an answer whose
scoring fails, times out (CPU seconds) or crashes scores 0.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from typing import Any

from seedledger.ledger.errors import SeedLedgerError
from seedledger.ledger.extras import ensure
from seedledger.trainers.rewards.answers import as_text
from seedledger.trainers.rewards.combine import WeightedReward
from seedledger.trainers.sandbox import Limits, require_sandbox, shared_sandbox
from seedledger.trainers.tasks.bounds import check_setting

from .base import Messages, Task, chat
from .sampling import mix64, stream

SYSTEM = (
    "Given a problem, your task is to answer the question by thinking step-by-step in a "
    "clear and specific manner.\nOnce you have thought about the reasoning process, provide "
    "the answer in the following format:\n<answer>answer here</answer>\nDo not explain your "
    "reasoning inside the answer tags, provide only the final answer. When an example is "
    "provided, you should strictly follow the format of the output/answer in that example.\n"
)
"""reasoning-gym's ``SYSTEM_PROMPTS["default"]`` (0.1.25), copied so the host never imports it."""
MAX_NEW_TOKENS = 256
MAX_ANSWER_CHARS = 20_000
BLOCK = 64
"""Rows made per sandbox request when a sequence is read one row at a time."""
_TEST, _TRAIN = 0x7E57, 0x78A1


def extract_answer(text: str, start: str = "<answer>", end: str = "</answer>") -> str | None:
    """The stripped text between the last ``start`` and the first ``end`` after it (any
    lines), or None; two ``rfind``/``find`` calls, linear on any input."""
    s = text.rfind(start)
    if s < 0:
        return None
    e = text.find(end, s + len(start))
    if e < 0:
        return None
    return text[s + len(start) : e].strip()


class GeneratedRows(Sequence):
    """The items ``0 … size−1`` of one seeded generator, made in the sandbox when first read."""

    def __init__(self, setup: dict[str, Any], split: str, limits: Limits) -> None:
        self.setup = setup
        self.split = split
        self.limits = limits
        self._rows: dict[int, dict[str, Any]] = {}

    def __len__(self) -> int:
        return int(self.setup["size"])

    def fetch(self, indices: Sequence[int]) -> list[dict[str, Any]]:
        """The rows at ``indices``, making the missing ones in one sandbox request."""
        missing = [i for i in dict.fromkeys(indices) if i not in self._rows]
        if missing:
            outcomes = shared_sandbox().run(
                "rg_rows", [{"index": i} for i in missing], setup=self.setup, limits=self.limits,
                item_seconds=600.0,
            )
            for i, outcome in zip(missing, outcomes, strict=True):
                if not outcome.ok:
                    raise SeedLedgerError(
                        f"task reasoning_gym:{self.setup['name']}: making row {i} failed ({outcome.status})"
                    )
                self._rows[i] = {**outcome.value, "split": self.split, "index": i}
        return [self._rows[i] for i in indices]

    def __getitem__(self, index: Any) -> Any:
        if isinstance(index, slice):
            return self.fetch(range(*index.indices(len(self))))
        if not -len(self) <= index < len(self):
            raise IndexError(index)
        index %= len(self)
        if index not in self._rows:
            self.fetch(range(index, min(len(self), index + BLOCK)))
        return self._rows[index]

    def __iter__(self) -> Iterator[dict[str, Any]]:
        for start in range(0, len(self), BLOCK):
            yield from self.fetch(range(start, min(len(self), start + BLOCK)))


class ReasoningGymTask(Task):
    """A Task whose rows are made lazily (``GeneratedRows``) by batch and by test slice."""

    def __init__(self, name: str, train: GeneratedRows, test: GeneratedRows, **kwargs: Any) -> None:
        super().__init__(name, train, test, prompt, **kwargs)

    def train_batch(self, seed: int, generation: int, size: int) -> tuple[list[int], list[dict[str, Any]]]:
        if size <= 0:
            raise SeedLedgerError(f"task {self.name}: batch size must be positive, not {size}")
        pool = self.train_rows()
        assert isinstance(pool, GeneratedRows)
        indices = stream(len(pool), mix64(seed, self.level), generation * size, size)
        return indices, pool.fetch(indices)

    def test_rows(self) -> Any:
        return self._test  # a GeneratedRows: slicing makes only the rows read


def prompt(row: dict[str, Any]) -> Messages:
    return chat(SYSTEM, row["question"])


def rg_reward(setups: dict[str, dict[str, Any]], limits: Limits, name: str):  # noqa: ANN201
    """A TRL-style reward: the library's ``score_answer`` per completion, run in the sandbox."""

    def reward(prompts: list[Any], completions: list[Any], split: list[Any], index: list[Any],
               **kwargs: Any) -> list[float | None]:
        scores: list[float | None] = [0.0] * len(completions)
        for part, setup in setups.items():
            where = [j for j, s in enumerate(split) if s == part]
            if not where:
                continue
            items = []
            for j in where:
                answer = extract_answer(as_text(completions[j]))
                if answer is not None and len(answer) > MAX_ANSWER_CHARS:
                    answer = None
                items.append({"index": int(index[j]), "answer": answer})
            outcomes = shared_sandbox().run("rg_score", items, setup=setup, limits=limits)
            for j, outcome in zip(where, outcomes, strict=True):
                value = outcome.value if outcome.ok else 0.0
                ok = isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
                scores[j] = min(1.0, max(0.0, float(value))) if ok else 0.0
        return scores

    reward.__name__ = f"reasoning_gym_{name}"
    return reward


def load(
    path: str | None = None,
    dataset: str | None = None,
    options: dict[str, Any] | None = None,
    data_seed: int = 0,
    seed: int = 0,
    train_size: int = 10_000,
    test_size: int = 100,
    max_new_tokens: int = MAX_NEW_TOKENS,
    cpu_seconds: int = 5,
    memory_mb: int = 1024,
    rewards: list[WeightedReward] | None = None,
    **unused: Any,
) -> Task:
    """``reasoning_gym:NAME`` (``path`` is the name) or ``{name: reasoning_gym, dataset: NAME,
    options: {...}}``; ``options`` go to the generator's config as they are."""
    name = dataset or path
    if not isinstance(name, str) or not name.isidentifier():
        raise SeedLedgerError(
            f"task reasoning_gym: expected a generator name, e.g. 'reasoning_gym:knights_knaves', got {name!r}"
        )
    options = {} if options is None else options
    if not isinstance(options, dict) or {"seed", "size"} & set(options):
        raise SeedLedgerError(
            f"task reasoning_gym:{name}: options must be a mapping of the generator's settings "
            "(without seed and size: data_seed, train_size and test_size set them)"
        )
    for label, value in (("train_size", train_size), ("test_size", test_size),
                         ("cpu_seconds", cpu_seconds), ("memory_mb", memory_mb)):
        check_setting(f"reasoning_gym:{name}", label, value)  # bounded: the dataset is built from these
    limits = Limits(cpu_seconds=cpu_seconds, memory_mb=memory_mb)
    ensure("reasoning_gym", f"task reasoning_gym:{name}")  # imported by the sandbox's child, not here
    require_sandbox(f"task reasoning_gym:{name}")
    setups = {
        "test": {"name": name, "options": options, "seed": mix64(data_seed, _TEST) & 0xFFFFFFFF, "size": test_size},
        "train": {"name": name, "options": options, "seed": mix64(data_seed, _TRAIN) & 0xFFFFFFFF, "size": train_size},
    }
    test = GeneratedRows(setups["test"], "test", limits)
    try:
        test.fetch([0])  # the generator exists and takes these options
    except SeedLedgerError as exc:
        raise SeedLedgerError(f"task reasoning_gym:{name}: {str(exc).removeprefix('sandbox rg_rows: ')}") from None
    train = GeneratedRows(setups["train"], "train", limits)
    default = WeightedReward(name, rg_reward(setups, limits, name), 1.0)
    return ReasoningGymTask(
        f"reasoning_gym:{name}", train, test, rewards=rewards or [default], seed=seed,
        max_new_tokens=max_new_tokens,
        info={"data_seed": data_seed, "source": "reasoning-gym", "dataset": name, "options": options,
              "train_seed": setups["train"]["seed"], "test_seed": setups["test"]["seed"]},
    )
