"""Reading answers out of completions: text of a completion, tagged spans, numbers.

Completions reach reward functions either as plain strings or, TRL's conversational form,
as a list of messages; every built-in reward accepts both. All scans here are linear in the
text, so a hostile 100 KB completion costs microseconds, not seconds.
"""

from __future__ import annotations

import re
from fractions import Fraction

MAX_NUMBER_CHARS = 64
"""Longest numeric string that ``parse_number`` converts."""

_NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?")


def as_text(completion: object) -> str:
    """The text of a completion: a str, or the last message's content in TRL's chat form."""
    if isinstance(completion, str):
        return completion
    if isinstance(completion, list | tuple) and completion:
        last = completion[-1]
        if isinstance(last, dict):
            content = last.get("content", "")
            return content if isinstance(content, str) else ""
    if isinstance(completion, dict):
        content = completion.get("content", "")
        return content if isinstance(content, str) else ""
    return ""


def extract_tag(text: str, start: str = "<answer>", end: str = "</answer>") -> str | None:
    """The stripped content of the last ``start…end`` span on one line, else ``None``.

    Same result as TinyZero's ``re.finditer(r"<answer>(.*?)</answer>")`` (no DOTALL: the
    span may not cross a newline), taking the last match, but searched over the whole
    completion, not only its last line.
    """
    found: str | None = None
    for line in text.split("\n"):
        pos = 0
        while True:
            s = line.find(start, pos)
            if s < 0:
                break
            e = line.find(end, s + len(start))
            if e < 0:
                break
            found = line[s + len(start) : e]
            pos = e + len(end)
    return None if found is None else found.strip()


def parse_number(text: str | int | float | None) -> Fraction | None:
    """An exact number from text like ``1,234``, ``$5.00``, ``-3``, ``3/4``, ``50%``; else None."""
    if text is None or isinstance(text, bool):
        return None
    if isinstance(text, int | float):
        try:
            return Fraction(text)
        except (ValueError, OverflowError):
            return None
    s = str(text).strip()
    if len(s) > MAX_NUMBER_CHARS:
        return None
    s = s.replace(",", "").replace("$", "").replace(" ", "").rstrip(".%")
    if not s or not s.isascii():
        return None
    try:
        return Fraction(s)
    except (ValueError, ZeroDivisionError, OverflowError):
        return None


def last_number(text: str) -> Fraction | None:
    """The last number written in ``text`` (commas as thousands separators), or None."""
    last = None
    for m in _NUMBER.finditer(text):
        last = m.group(0)
    return None if last is None else parse_number(last)
