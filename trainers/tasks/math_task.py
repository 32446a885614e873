"""``math``: question/answer rows in GSM8K's layout (final answer after ``####``).

The model's answer is the content of its last ``<answer>`` span, else the text after its
last ``####``, else its last number; it is correct when it equals the reference as an exact
number after normalization (thousands commas, ``$``, ``%``, trailing period, fractions).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ledger.errors import SeedLedgerError
from trainers.rewards.answers import as_text, extract_tag, last_number, parse_number
from trainers.rewards.combine import WeightedReward

from .base import Messages, Task, chat
from .datafiles import as_scalar_text, check_columns, read_rows
from .datafiles import as_text as text_cell
from .sampling import split_rows

SYSTEM = (
    "Solve the problem step by step, then give the final number inside <answer></answer> "
    "tags, e.g. <answer>42</answer>."
)
MAX_NEW_TOKENS = 256


def reference_answer(answer: str) -> str:
    """The final answer of a GSM8K answer field: the text after the last ``####``."""
    return answer.rsplit("####", 1)[-1].strip()


def model_answer(text: str) -> Any:
    tagged = extract_tag(text)
    if tagged is not None:
        return parse_number(tagged)
    if "####" in text:
        tail = text.rsplit("####", 1)[-1].strip().split("\n", 1)[0]
        value = parse_number(tail)
        return value if value is not None else last_number(tail)  # 0 is an answer, not a miss
    return last_number(text)


def math_reward(
    prompts: list[Any], completions: list[Any], answer: list[Any], **kwargs: Any
) -> list[float | None]:
    """1.0 when the model's number equals the reference number, else 0.0."""
    out: list[float | None] = []
    for completion, gold in zip(completions, answer, strict=True):
        ref = parse_number(reference_answer(str(gold)))
        got = model_answer(as_text(completion))
        out.append(1.0 if ref is not None and got is not None and got == ref else 0.0)
    return out


def prompt(row: dict[str, Any]) -> Messages:
    return chat(SYSTEM, row["question"])


def load_file(path: str | Path) -> list[dict[str, Any]]:
    rows = check_columns(read_rows(path), path, {"question": text_cell, "answer": as_scalar_text})
    for i, row in enumerate(rows):
        if parse_number(reference_answer(row["answer"])) is None:
            raise SeedLedgerError(
                f"{path}: row {i}: column 'answer': no number after '####', got {row['answer'][-40:]!r}"
            )
    return rows


def load(
    path: str | None = None,
    test_path: str | None = None,
    data_seed: int = 0,
    seed: int = 0,
    test_size: int = 100,
    rewards: list[WeightedReward] | None = None,
    **unused: Any,
) -> Task:
    """Rows from ``path`` (a seeded split gives the test rows) or ``path`` + ``test_path``."""
    if path is None:
        raise SeedLedgerError("task math: needs a file, e.g. 'math:data/gsm8k.jsonl'")
    test_rows = load_file(test_path) if test_path is not None else None
    train, test = split_rows(load_file(path), test_rows, test_size, data_seed, path)
    return Task("math", train, test, prompt,
                rewards or [WeightedReward("math", math_reward, 1.0)],
                seed=seed, max_new_tokens=MAX_NEW_TOKENS,
                info={"data_seed": data_seed, "source": str(path), "test_source": test_path})
