"""``countdown``: TinyZero's Countdown task — reach a target with 3–4 numbers, each used once.

Seeded generator of solvable problems (a random expression over the numbers, kept when its
value is a whole target in range), TinyZero's prompt, TinyZero's reward, and a loader for
files in TinyZero's layout (columns ``target`` and ``nums``; parquet or jsonl).

Reward (TinyZero ``compute_score``): 0 without an ``<answer>…</answer>`` span; 0.1 when the
answer is malformed, does not use each number exactly once, or is wrong; 1.0 when it
evaluates to the target within 1e-5. Two deliberate differences: the answer is checked by
``trainers.rewards.verifier`` instead of ``eval`` (so ``**`` is refused, scoring 0.1), and
the span is searched in the whole completion, not only in its last line.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from seedledger.ledger.errors import SeedLedgerError
from seedledger.trainers.rewards.answers import as_text, extract_tag
from seedledger.trainers.rewards.combine import WeightedReward
from seedledger.trainers.rewards.verifier import MAX_LENGTH, numbers_used, safe_eval

from .base import Messages, Task, chat
from .datafiles import as_int, as_int_list, check_columns, read_rows
from .sampling import Rng, split_rows

SYSTEM = (
    "You are a helpful assistant. You first thinks about the reasoning process in the mind "
    "and then provides the user with the answer."
)
USER = (
    "Using the numbers {nums}, create an equation that equals {target}. You can use basic "
    "arithmetic operations (+, -, *, /) and each number can only be used once. Show your work "
    "in <think> </think> tags. And return the final answer in <answer> </answer> tags, for "
    "example <answer> (1 + 2) / 3 </answer>."
)
MAX_NEW_TOKENS = 256
FORMAT_SCORE = 0.1
# (fewest numbers, most numbers, largest number, largest target) per difficulty level;
# the default is TinyZero's mix of 3 and 4 numbers up to 100.
LEVELS = ((3, 3, 20, 50), (3, 3, 100, 100), (3, 4, 100, 100), (4, 4, 100, 100))
DEFAULT_LEVEL = 2


def score(completion: object, target: int | float, nums: list[int]) -> float:
    """TinyZero's score of one completion (see the module docstring)."""
    equation = extract_tag(as_text(completion))
    if equation is None:
        return 0.0
    if len(equation) > MAX_LENGTH:
        return FORMAT_SCORE
    if sorted(numbers_used(equation)) != sorted(nums):
        return FORMAT_SCORE
    value = safe_eval(equation)
    if value is None:
        return FORMAT_SCORE
    return 1.0 if abs(float(value) - target) < 1e-5 else FORMAT_SCORE


def countdown_reward(
    prompts: list[Any], completions: list[Any], target: list[Any], nums: list[Any], **kwargs: Any
) -> list[float]:
    """TRL-style reward: TinyZero's Countdown score per completion."""
    return [
        score(c, t, list(n)) for c, t, n in zip(completions, target, nums, strict=True)
    ]


def prompt(row: dict[str, Any]) -> Messages:
    return chat(SYSTEM, USER.format(nums=list(row["nums"]), target=row["target"]))


def make_problem(rng: Rng, count: int, largest: int, max_target: int) -> dict[str, Any] | None:
    """Combine the numbers in a random order and tree with Countdown's rules (positive
    differences, exact divisions); the value is the target. None when out of range."""
    nums = [rng.randint(1, largest) for _ in range(count)]
    values = list(nums)
    while len(values) > 1:
        i = rng.below(len(values))
        a = values.pop(i)
        b = values.pop(rng.below(len(values)))
        ops = [a + b, a * b]
        if a != b:
            ops.append(abs(a - b))
        if b and a % b == 0:
            ops.append(a // b)
        if a and b % a == 0:
            ops.append(b // a)
        values.append(rng.choice(ops))
    target = values[0]
    if not 1 <= target <= max_target:
        return None
    return {"target": target, "nums": nums}


def generate(data_seed: int, level: int, count: int, role: int, exclude: set | None = None) -> list[dict]:
    """``count`` distinct solvable problems at ``level``; ``role`` 0 test, 1 train."""
    fewest, most, largest, max_target = LEVELS[level]
    rng = Rng(data_seed, 0xC0DE, level, role)
    seen = set(exclude or ())
    rows: list[dict[str, Any]] = []
    attempts = 0
    while len(rows) < count and attempts < 50 * count:
        attempts += 1
        row = make_problem(rng, rng.randint(fewest, most), largest, max_target)
        if row is None:
            continue
        key = (row["target"], tuple(sorted(row["nums"])))
        if key not in seen:
            seen.add(key)
            rows.append(row)
    return rows


def load_file(path: str | Path) -> list[dict[str, Any]]:
    """Rows of a TinyZero-layout file: ``target`` (int) and ``nums`` (list of ints)."""
    rows = check_columns(read_rows(path), path, {"target": as_int, "nums": as_int_list})
    return [{"target": r["target"], "nums": r["nums"]} for r in rows]


def load(
    data_seed: int = 0,
    seed: int = 0,
    level: int = DEFAULT_LEVEL,
    train_size: int = 2000,
    test_size: int = 200,
    path: str | None = None,
    test_path: str | None = None,
    rewards: list[WeightedReward] | None = None,
    **unused: Any,
) -> Task:
    """Generated problems, or TinyZero files (``path``; optional ``test_path``, else the last
    part of a seeded split of ``path`` of ``test_size`` rows)."""
    rewards = rewards or [WeightedReward("countdown", countdown_reward, 1.0)]
    if path is None:
        if not 0 <= level < len(LEVELS):
            raise SeedLedgerError(f"task countdown: level {level} outside 0..{len(LEVELS) - 1}")
        test = generate(data_seed, level, test_size, role=0)
        held_out = {(r["target"], tuple(sorted(r["nums"]))) for r in test}

        def train(lvl: int) -> list[dict[str, Any]]:
            return generate(data_seed, lvl, train_size, role=1, exclude=held_out)

        return Task("countdown", train, test, prompt, rewards, seed=seed, levels=len(LEVELS),
                    level=level, max_new_tokens=MAX_NEW_TOKENS,
                    info={"data_seed": data_seed, "source": "generated"})
    test_rows = load_file(test_path) if test_path is not None else None
    train_rows, test = split_rows(load_file(path), test_rows, test_size, data_seed, path)
    return Task("countdown", train_rows, test, prompt, rewards, seed=seed,
                max_new_tokens=MAX_NEW_TOKENS,
                info={"data_seed": data_seed, "source": str(path), "test_source": test_path})
