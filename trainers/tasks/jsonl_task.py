"""``jsonl:PATH``: any local dataset (jsonl or parquet) with an exact-match or regex reward.

Rows need a prompt column (text, or a list of chat messages as in TRL's conversational
datasets) and an answer column. The model's answer is its last ``<answer>`` span when it
writes one, else its whole stripped text. ``match``: ``exact`` (equal after whitespace
collapsing; ``casefold`` optional), ``regex`` (the answer cell is a pattern that must
match the whole answer), or ``numeric`` (equal as numbers).

Split: with no ``test_path``, ``test_size`` rows of a seeded permutation are held out; by
default ``default_test_size`` rows (100, as always, above 100 rows; a fifth of a smaller
file, at least 1), so a 30-row file trains on 24 and scores on 6. A file too small to split
(1 row) is refused in one line.

Regex patterns come from the dataset and are compiled once, when the task loads; an
invalid one is refused there with a one-line error naming the file, row and column. A
pattern runs on model output, which is hostile, so only answers up to
``MAX_REGEX_TEXT`` characters are matched (a longer answer scores 0.0): that bounds the
work of any pattern without catastrophic backtracking. Python's ``re`` has no time limit,
so a pattern that backtracks exponentially (``(a+)+$``) can still be slow on a short
answer: keep dataset patterns free of nested unbounded repeats.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from seedledger.ledger.errors import SeedLedgerError
from seedledger.trainers.rewards.answers import as_text, extract_tag, parse_number
from seedledger.trainers.rewards.combine import RewardFn, WeightedReward
from seedledger.trainers.tasks.bounds import check_setting

from .base import Messages, Task, chat
from .datafiles import as_scalar_text, check_columns, read_rows
from .sampling import split_rows

MATCHES = ("exact", "regex", "numeric")
MAX_REGEX_TEXT = 1000
"""Longest answer (characters, after stripping) that a ``regex`` reward matches."""
DEFAULT_TEST_SIZE = 100
"""The most rows the default split holds out."""


def default_test_size(rows: int) -> int:
    """The held-out rows when ``test_size`` is not given: ``DEFAULT_TEST_SIZE`` (100, the old
    fixed default, so every stored run keeps its split) for files above 100 rows; a fifth,
    at least 1, for the smaller files that default refused, so they train as given."""
    return DEFAULT_TEST_SIZE if rows > DEFAULT_TEST_SIZE else max(1, rows // 5)


def _norm(text: str, casefold: bool) -> str:
    text = " ".join(text.split())
    return text.casefold() if casefold else text


def _prompt_cell(value: Any) -> Any:
    if isinstance(value, str) and value.strip():
        return value
    if (
        isinstance(value, list)
        and value
        and all(isinstance(m, dict) and isinstance(m.get("role"), str)
                and isinstance(m.get("content"), str) for m in value)
    ):
        return value
    raise ValueError("expected text or a list of {role, content} messages")


def compile_pattern(pattern: str, casefold: bool) -> re.Pattern[str]:
    return re.compile(pattern, re.IGNORECASE if casefold else 0)


def match_reward(
    match: str = "exact",
    answer_column: str = "answer",
    casefold: bool = False,
    patterns: dict[str, re.Pattern[str]] | None = None,
) -> RewardFn:
    """A TRL-style reward: 1.0 when the model's answer matches the row's answer cell.

    ``patterns`` (regex only): the dataset's patterns compiled at load, keyed by their text;
    a pattern not in it is compiled on first use (an invalid one scores 0.0)."""
    if match not in MATCHES:
        raise SeedLedgerError(f"task jsonl: match must be one of {', '.join(MATCHES)}, not {match!r}")
    compiled: dict[str, re.Pattern[str] | None] = dict(patterns or {})

    def regex_ok(pattern: str, got: str) -> bool:
        if len(got) > MAX_REGEX_TEXT:
            return False
        if pattern not in compiled:
            try:
                compiled[pattern] = compile_pattern(pattern, casefold)
            except re.error:
                compiled[pattern] = None
        rx = compiled[pattern]
        return rx is not None and rx.fullmatch(got) is not None

    def reward(prompts: list[Any], completions: list[Any], **columns: Any) -> list[float | None]:
        golds = columns[answer_column]
        out: list[float | None] = []
        for completion, gold in zip(completions, golds, strict=True):
            text = as_text(completion)
            tagged = extract_tag(text)
            got = (tagged if tagged is not None else text).strip()
            if match == "exact":
                ok = _norm(got, casefold) == _norm(str(gold), casefold)
            elif match == "numeric":
                a, b = parse_number(got), parse_number(str(gold))
                ok = a is not None and a == b
            else:
                ok = regex_ok(str(gold), got)
            out.append(1.0 if ok else 0.0)
        return out

    reward.__name__ = f"{match}_match"
    return reward


def _split(
    rows: list[dict[str, Any]], test_rows: list[dict[str, Any]] | None,
    test_size: int | None, data_seed: int, path: str,
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(train, test), with the default held-out size and one-line errors that say what to set."""
    if test_rows is None and len(rows) < 2:
        raise SeedLedgerError(
            f"{path}: cannot split {len(rows)} row into train and test: a jsonl task needs at "
            "least 2 rows, or a separate test_path"
        )
    if test_size is None:
        test_size = default_test_size(len(rows))
    elif check_setting("jsonl", "test_size", test_size) >= len(rows) and test_rows is None:
        raise SeedLedgerError(
            f"{path}: test_size {test_size} leaves no training rows of {len(rows)} (set it below "
            f"{len(rows)}, or leave it out for a fifth: {default_test_size(len(rows))})"
        )
    return split_rows(rows, test_rows, test_size, data_seed, path)


def load(
    path: str | None = None,
    test_path: str | None = None,
    prompt_column: str = "prompt",
    answer_column: str = "answer",
    match: str = "exact",
    casefold: bool = False,
    system: str | None = None,
    data_seed: int = 0,
    seed: int = 0,
    test_size: int | None = None,
    max_new_tokens: int | None = 64,
    rewards: list[WeightedReward] | None = None,
    **unused: Any,
) -> Task:
    if path is None:
        raise SeedLedgerError("task jsonl: needs a file, e.g. 'jsonl:data/qa.jsonl'")
    checks = {prompt_column: _prompt_cell, answer_column: as_scalar_text}
    patterns: dict[str, re.Pattern[str]] = {}

    def read(p: str) -> list[dict[str, Any]]:
        rows = check_columns(read_rows(p), p, checks)
        if match == "regex":
            for i, row in enumerate(rows):
                pattern = row[answer_column]
                if pattern in patterns:
                    continue
                try:
                    patterns[pattern] = compile_pattern(pattern, casefold)
                except (re.error, OverflowError, RecursionError) as exc:
                    reason = " ".join(str(exc).split())
                    raise SeedLedgerError(
                        f"{p}: row {i}: column {answer_column!r}: bad regex: {reason}"
                    ) from None
        return rows

    test_rows = read(test_path) if test_path is not None else None
    train, test = _split(read(path), test_rows, test_size, data_seed, path)

    def prompt(row: dict[str, Any]) -> Messages:
        cell = row[prompt_column]
        if isinstance(cell, list):
            msgs = [dict(m) for m in cell]
            return ([{"role": "system", "content": system}] + msgs) if system else msgs
        return chat(system, cell)

    default = WeightedReward(
        f"{match}_match", match_reward(match, answer_column, casefold, patterns), 1.0
    )
    return Task(f"jsonl:{Path(path).name}", train, test, prompt, rewards or [default],
                seed=seed, max_new_tokens=max_new_tokens,
                info={"data_seed": data_seed, "source": str(path), "test_source": test_path,
                      "prompt_column": prompt_column, "answer_column": answer_column,
                      "match": match, "casefold": casefold, "system": system})
