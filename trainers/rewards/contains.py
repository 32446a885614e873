"""`contains`: the reference answer alone, with partial credit for stating it inside more text.

A reward that still moves where exact match is 0 everywhere: a model that answers in a
sentence ("The plural of 'tree' is 'trees'.") states the right word but never matches
``trees`` exactly, so members differ only in how much they say around it. Per completion:

- **1.0** when the answer (the last ``<answer>`` span when there is one, else the whole
  stripped text) equals the row's reference after whitespace collapsing (and casefolding
  with ``casefold``): the jsonl task's exact-match rule, so 1.0 is exactly its verdict;
- **partial × |reference| / |answer|** when the reference occurs in the answer as a whole
  word (no letter, digit or ``_`` on either side): the shorter the text around it, the
  more credit, up to ``partial`` for nothing but punctuation or quotes around it;
- **0.0** otherwise.

The reference is only looked for in the text, never scored as a likelihood target. One
``str.find`` per occurrence: at worst |completion| × |reference| character steps.
"""

from __future__ import annotations

from typing import Any

from seedledger.ledger.errors import SeedLedgerError

from .answers import as_text, extract_tag
from .combine import RewardFn


def _norm(text: str, casefold: bool) -> str:
    text = " ".join(text.split())
    return text.casefold() if casefold else text


def _is_word_char(c: str) -> bool:
    return c.isalnum() or c == "_"


def whole_word_in(word: str, text: str) -> bool:
    """Whether `word` occurs in `text` with no word character right before or after it."""
    at = text.find(word)
    while at >= 0:
        end = at + len(word)
        if (at == 0 or not _is_word_char(text[at - 1])) and (end == len(text) or not _is_word_char(text[end])):
            return True
        at = text.find(word, at + 1)
    return False


def contains_score(text: str, reference: str, partial: float = 0.5, casefold: bool = False) -> float:
    """One completion's score against its reference answer (see the module docstring)."""
    tagged = extract_tag(text)
    got = _norm(tagged if tagged is not None else text, casefold)
    want = _norm(reference, casefold)
    if not want or not got:
        return 0.0
    if got == want:
        return 1.0
    return partial * len(want) / len(got) if whole_word_in(want, got) else 0.0


def contains_reward(column: str = "answer", partial: float = 0.5, casefold: bool = False) -> RewardFn:
    """A TRL-style reward function scoring each completion against the row's `column` cell."""

    def reward(prompts: list[Any], completions: list[Any], **columns: Any) -> list[float | None]:
        if column not in columns:
            raise SeedLedgerError(
                f"reward contains: the rows have no column {column!r} "
                f"(columns: {', '.join(sorted(columns)) or 'none'})"
            )
        return [
            None if ref is None else contains_score(as_text(c), str(ref), partial, casefold)
            for c, ref in zip(completions, columns[column], strict=True)
        ]

    reward.__name__ = "contains"
    return reward
