"""Reading answers out of completions: text of a completion, tagged spans, numbers.

Completions reach reward functions either as plain strings or, TRL's conversational form,
as a list of messages; every built-in reward accepts both. All scans here are linear in the
text, so a hostile 100 KB completion costs microseconds, not seconds.
"""

from __future__ import annotations

import re
from fractions import Fraction
from functools import lru_cache

MAX_NUMBER_CHARS = 64
"""Longest numeric string that ``parse_number`` converts (so at most 64 digits)."""
MAX_EXPONENT = 100
"""Largest ``|exponent|`` in scientific notation that ``parse_number`` accepts: ``Fraction``
builds ``10**exponent`` exactly, so ``1e99999999`` alone would take over a minute."""

_DIGIT = re.compile(r"\d")
_NUMBER_REVERSED = re.compile(r"(?:\d+\.)?[\d,]*\d-?")  # -?\d[\d,]*(?:\.\d+)? read backwards
# What parse_number accepts after clean-up, ASCII digits only: a decimal with an optional
# exponent, or an integer fraction ``p/q``. Stricter than ``Fraction``'s own grammar
# (no ``_`` separators, no inner spaces), and the exponent is read here to be bounded.
_DECIMAL = re.compile(r"[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE]([+-]?[0-9]+))?")
_RATIO = re.compile(r"[+-]?[0-9]+/[0-9]+")


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
    completion, not only its last line. Found from the right by a constant number of
    C-level passes (a hostile 100 KB completion of newlines, thousands of tags or runs of
    ``>`` costs about a millisecond, not a Python step per line or per span).
    """
    if not start or not end or _markers_overlap(start, end):
        return _extract_tag_scan(text, start, end)
    last_end = text.rfind(end)
    if last_end < 0 or text.find(start, 0, last_end) < 0:
        return None  # no start tag before any end tag: no span at all
    marks = _sentinels(start, end)
    if marks is None:
        return _extract_tag_scan(text, start, end)
    # Each tag becomes one sentinel character and filler of the tag's length (so positions
    # hold). The last line holding a start tag before an end tag holds the last match; on
    # the reversed text it is the first end sentinel followed on its line by a start
    # sentinel, which one character-class scan finds (never backtracked into: linear).
    e_mark, s_mark, fill, plain = marks
    masked = text
    for c in (e_mark, s_mark, fill):  # a sentinel already in the text is plain text
        if c in masked:
            masked = masked.replace(c, plain)
    masked = masked.replace(end, e_mark + fill * (len(end) - 1))
    masked = masked.replace(start, s_mark + fill * (len(start) - 1))
    m = _last_line_pattern(e_mark, s_mark).search(masked[::-1])
    if m is None:
        return None
    q = len(text) - 1 - m.start()  # where that end tag begins
    line_start = text.rfind("\n", 0, q) + 1
    line_end = text.find("\n", q)
    line_end = len(text) if line_end < 0 else line_end
    e = text.rfind(end, line_start, line_end)
    s = text.rfind(start, line_start, e)
    # The last match ends at the first end tag after ``s`` (a match's content holds no
    # end tag) and starts at the first start tag after the last end tag before ``s``
    # (the left-to-right scan skips stray end tags the same way).
    match_end = text.find(end, s + len(start))
    before = text.rfind(end, line_start, s)
    match_start = text.find(start, line_start if before < 0 else before + len(end))
    return text[match_start + len(start) : match_end].strip()


_SENTINELS = "\x0c\x0b\x01\x02\x03\x04\x05\x06\x07\x08"
# Best first: with \x0c and \x0b the characters a gap excludes (newline, both sentinels)
# are one range, which `re` scans about three times faster than scattered characters.


@lru_cache(maxsize=32)
def _sentinels(start: str, end: str) -> tuple[str, str, str, str] | None:
    """Three sentinel characters and a plain one, none of them in the markers (so swapping
    them in or out of a text never makes or breaks a tag); None if the markers use them."""
    free = [c for c in _SENTINELS if c not in start and c not in end]
    plain = next((c for c in " ?#_" if c not in start and c not in end), None)
    if len(free) < 3 or plain is None:
        return None
    return free[0], free[1], free[2], plain


@lru_cache(maxsize=8)
def _last_line_pattern(e_mark: str, s_mark: str) -> re.Pattern[str]:
    excluded = "".join(re.escape(c) for c in sorted({"\n", e_mark, s_mark}))
    return re.compile(f"{re.escape(e_mark)}[^{excluded}]*+{re.escape(s_mark)}")


def _markers_overlap(start: str, end: str) -> bool:
    """Whether an occurrence of one marker can overlap one of the other or of itself (or a
    marker holds a newline), which the right-to-left search in ``extract_tag`` does not
    handle."""
    if "\n" in start or "\n" in end or start in end or end in start:
        return True
    for a, b in ((start, end), (end, start), (start, start), (end, end)):
        if any(a.endswith(b[:k]) for k in range(1, min(len(a), len(b)))):
            return True
    return False


def _extract_tag_scan(text: str, start: str, end: str) -> str | None:
    """``extract_tag`` by a left-to-right scan of each line (any markers)."""
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
    """An exact number from text like ``1,234``, ``$5.00``, ``-3``, ``3/4``, ``50%``, ``2.5e3``;
    else None. Bounded work on any input: at most ``MAX_NUMBER_CHARS`` characters, ASCII
    digits only, exponents within ``±MAX_EXPONENT``."""
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
    decimal = _DECIMAL.fullmatch(s)
    if decimal is None and _RATIO.fullmatch(s) is None:
        return None
    if decimal is not None and decimal.group(1) is not None and abs(int(decimal.group(1))) > MAX_EXPONENT:
        return None
    try:
        return Fraction(s)
    except (ValueError, ZeroDivisionError, OverflowError):
        return None


def last_number(text: str) -> Fraction | None:
    """The last number written in ``text``, or None: the longest ``-?d[d,]*(.d+)?`` (commas
    as thousands separators) that ends at the last digit, parsed by ``parse_number``.

    Read from the right (one match on the reversed text), so the cost does not grow with
    the count of numbers before it. In a chain of dots the number is the last two groups
    (``1.2.3`` gives 2.3)."""
    rev = text[::-1]
    digit = _DIGIT.search(rev)
    if digit is None:
        return None
    m = _NUMBER_REVERSED.match(rev, digit.start())
    return None if m is None else parse_number(m.group(0)[::-1])
