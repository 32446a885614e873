"""``arithmetic``: the demo task — short generated sums with answers in ``<answer>`` tags.

Small enough that SmolLM2-135M-Instruct gets part of it right greedily with a handful of
tokens, so ES has a signal to climb on 2 CPU cores. Levels (for a curriculum) change the
operand ranges and operators; the default level is the tuned one.

Measured (benchmarks/task_baseline.py, 64 test rows, greedy, max_new_tokens=16): base
SmolLM2-135M-Instruct scores a mean 0.203 at the default level (addition up to 30):
6% right in tags, 17% right without tags, 55% tags with a wrong number, 22% nothing.
With subtraction (level 2's operators, numbers up to 20) it was 0.153.

Two answer checks (`check`): ``tags`` (the default) gives partial credit for the tags;
``number`` is a verifier only, 1.0 when the number the model answers is right, however it
writes it. Under ``number`` the base is right 19% of the time (200 test rows, greedy, 12
new tokens): 10% of its tagged guesses, about half of its written equations
(``17 + 10 = 27``), a reward-only run's signal (docs/choosing.md).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import cache
from itertools import product
from typing import Any

from seedledger.ledger.errors import SeedLedgerError
from seedledger.trainers.rewards.answers import as_text, extract_tag, last_number, parse_number
from seedledger.trainers.rewards.combine import WeightedReward

from .base import Messages, Task, chat
from .sampling import Rng


@dataclass(frozen=True)
class Level:
    operands: int
    lo: int
    hi: int
    ops: str


LEVELS = (
    Level(2, 1, 12, "+"),
    Level(2, 1, 30, "+"),
    Level(2, 1, 30, "+-"),
    Level(2, 2, 99, "+-*"),
    Level(3, 1, 30, "+-*"),
)
DEFAULT_LEVEL = 1
SYSTEM = "Answer with the number in <answer></answer> tags."
EXAMPLE = ({"role": "user", "content": "What is 3 + 4?"},
           {"role": "assistant", "content": "<answer>7</answer>"})
MAX_NEW_TOKENS = 16
UNTAGGED_SCORE = 0.5
_LEADING_NUMBER = re.compile(r"-?\d+(?:\.\d+)?")
FORMAT_SCORE = 0.1
CHECKS = ("tags", "number")


def make_problem(rng: Rng, level: Level) -> dict[str, Any]:
    """One question ``a op b [op c]`` and its integer answer (no division)."""
    nums = [rng.randint(level.lo, level.hi) for _ in range(level.operands)]
    ops = [rng.choice(level.ops) for _ in range(level.operands - 1)]
    return _problem(level, nums, ops)


def _problem(level: Level, nums: list[int], ops: list[str]) -> dict[str, Any]:
    """The problem drawn as ``nums`` and ``ops``."""
    if level.operands == 2 and ops[0] == "-" and nums[0] < nums[1]:
        nums.reverse()  # keep two-number differences non-negative
    if "*" in ops and level.operands == 2:
        nums[1] = 2 + nums[1] % 11  # products stay small: a × (2..12)
    expr = " ".join(str(n) if i == 0 else f"{op} {n}" for i, (n, op) in enumerate(zip(nums, [""] + ops, strict=True)))
    answer = _value(nums, ops)
    return {"question": f"What is {expr}?", "answer": answer}


def _value(nums: list[int], ops: list[str]) -> int:
    """Evaluate with the usual precedence (× before + −), without eval."""
    terms = [nums[0]]
    signs = [1]
    for n, op in zip(nums[1:], ops, strict=True):
        if op == "*":
            terms[-1] *= n
        else:
            terms.append(n)
            signs.append(1 if op == "+" else -1)
    return sum(s * t for s, t in zip(signs, terms, strict=True))


def generate(
    data_seed: int, level: int, count: int, role: int = 0, exclude: set[str] | None = None
) -> list[dict]:
    """``count`` distinct problems at ``level`` (fewer if the level has fewer); ``role`` 0 is
    the test stream, 1 the training stream."""
    rng = Rng(data_seed, 0xA417, level, role)
    rows: list[dict[str, Any]] = []
    seen = set(exclude or ())
    # A small level runs dry (level 1 has 900 questions; the default asks 2,000 training
    # rows): once every question it can draw is seen, no further attempt adds a row, so the
    # loop stops there instead of spending all 20·count attempts; the rows are the same.
    left = len(_questions(LEVELS[level]) - seen) if _draws(LEVELS[level]) <= 2 * (count + len(seen)) else -1
    attempts = 0
    while len(rows) < count and attempts < 20 * count and left != 0:
        attempts += 1
        row = make_problem(rng, LEVELS[level])
        if row["question"] not in seen:
            seen.add(row["question"])
            rows.append(row)
            left -= 1
    return rows


def _draws(level: Level) -> int:
    """How many (numbers, operators) draws `make_problem` can make at `level`."""
    return (level.hi - level.lo + 1) ** level.operands * len(level.ops) ** (level.operands - 1)


@cache
def _questions(level: Level) -> frozenset[str]:
    """Every question `make_problem` can draw at `level` (all its draws enumerated)."""
    numbers = product(range(level.lo, level.hi + 1), repeat=level.operands)
    return frozenset(_problem(level, list(nums), list(ops))["question"]
                     for nums in numbers for ops in product(level.ops, repeat=level.operands - 1))


def prompt(row: dict[str, Any]) -> Messages:
    """System line, one worked example as a previous turn, then the question."""
    msgs = chat(SYSTEM, row["question"])
    return [msgs[0], *(dict(m) for m in EXAMPLE), msgs[1]]


def untagged_answer(text: str) -> Any:
    """The answer a model wrote without tags: on the first line, the number right after the
    last ``=`` (SmolLM2's habit: ``12 + 4 = 16``), or the line itself if it is a number."""
    line = text.strip().split("\n", 1)[0]
    if "=" in line:
        m = _LEADING_NUMBER.match(line.rsplit("=", 1)[1].strip())
        return parse_number(m.group(0)) if m else None
    return parse_number(line)


def arithmetic_reward(
    prompts: list[Any], completions: list[Any], answer: list[Any], **kwargs: Any
) -> list[float | None]:
    """1.0: right answer in ``<answer>`` tags; 0.5: right answer without tags (``a + b = c``
    or a bare number on the first line); 0.1: tags with a wrong answer; else 0.

    The partial credits give ES a slope to climb from the base model, which answers right
    about a third of the time but almost never uses the tags."""
    out: list[float | None] = []
    for completion, gold in zip(completions, answer, strict=True):
        text = as_text(completion)
        want = parse_number(gold)
        tagged = extract_tag(text)
        if tagged is not None:
            value = parse_number(tagged)
            out.append(1.0 if value is not None and value == want else FORMAT_SCORE)
            continue
        value = untagged_answer(text)
        out.append(UNTAGGED_SCORE if value is not None and value == want else 0.0)
    return out


def answered_number(text: str) -> Any:
    """The number a completion answers: its ``<answer>`` tags' content where it uses them,
    else the last number on its first line (``12 + 4 = 16``, ``16``, ``16</answer>``)."""
    tagged = extract_tag(text)
    if tagged is not None:
        return parse_number(tagged)
    return last_number(text.strip().split("\n", 1)[0])


def number_reward(
    prompts: list[Any], completions: list[Any], answer: list[Any], **kwargs: Any
) -> list[float | None]:
    """1.0 when the number the completion answers (`answered_number`) is right, else 0: a
    verifier with no credit for the form, so the run is free to find its own."""
    out: list[float | None] = []
    for completion, gold in zip(completions, answer, strict=True):
        value = answered_number(as_text(completion))
        out.append(1.0 if value is not None and value == parse_number(gold) else 0.0)
    return out


def load(
    data_seed: int = 0,
    seed: int = 0,
    level: int = DEFAULT_LEVEL,
    train_size: int = 2000,
    test_size: int = 200,
    rewards: list[WeightedReward] | None = None,
    check: str = "tags",
    **unused: Any,
) -> Task:
    """The arithmetic task; the test split is generated first and kept out of training.
    `check` picks the task's answer check: ``tags`` (partial credit) or ``number``."""
    if not 0 <= level < len(LEVELS):
        raise SeedLedgerError(f"task arithmetic: level {level} outside 0..{len(LEVELS) - 1}")
    if check not in CHECKS:
        raise SeedLedgerError(f"task arithmetic: check {check!r} is not one of {', '.join(CHECKS)}")
    own = (WeightedReward("arithmetic", arithmetic_reward, 1.0) if check == "tags"
           else WeightedReward("right_number", number_reward, 1.0))
    test = generate(data_seed, level, test_size)
    held_out = {r["question"] for r in test}

    def train(lvl: int) -> list[dict[str, Any]]:
        return generate(data_seed, lvl, train_size, role=1, exclude=held_out)

    return Task(
        "arithmetic",
        train,
        test,
        prompt,
        rewards or [own],
        seed=seed,
        levels=len(LEVELS),
        level=level,
        max_new_tokens=MAX_NEW_TOKENS,
        info={"data_seed": data_seed, "system": SYSTEM, "example": list(EXAMPLE)},
    )
