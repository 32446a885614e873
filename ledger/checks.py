"""Checks of untrusted JSON values (seed-file headers): each returns the value or raises
Malformed("bad WHAT"), which the reader turns into one line. Types are exact (a boolean is
no number), numbers finite and in range, strings what the SQL columns hold."""

from __future__ import annotations

import math
from typing import Any

from seedledger.ledger import codec

MAX_TEXT = 1 << 16  # longest free-text field a sane header holds


class Malformed(Exception):
    """A malformed value; its message is the reason shown to the user."""


def need(cond: bool, what: str) -> None:
    if not cond:
        raise Malformed(what)


def integer(v: Any, lo: int, hi: int, what: str) -> int:
    need(isinstance(v, int) and not isinstance(v, bool) and lo <= v <= hi, f"bad {what}")
    return v


def finite(v: Any, what: str) -> float:
    """A finite number (JSON int or float; booleans are not numbers here)."""
    need(isinstance(v, float | int) and not isinstance(v, bool), f"bad {what}")
    try:
        x = float(v)
    except OverflowError:
        raise Malformed(f"bad {what}") from None
    need(math.isfinite(x), f"bad {what} (not finite)")
    return x


def text(v: Any, what: str, max_len: int = MAX_TEXT, optional: bool = False) -> str | None:
    """A string the SQL columns take: at most `max_len` characters, valid UTF-8, no NUL."""
    if optional and v is None:
        return None
    need(isinstance(v, str) and len(v) <= max_len and "\x00" not in v, f"bad {what}")
    try:
        v.encode("utf-8")
    except UnicodeEncodeError:  # a lone surrogate from a \ud800 escape
        raise Malformed(f"bad {what} (not UTF-8)") from None
    return v


def u64_text(v: Any, what: str) -> int:
    """An unsigned 64-bit integer written as decimal text (JSON numbers lose bits)."""
    need(isinstance(v, str) and v.isascii() and v.isdigit() and len(v) <= 20, f"bad {what}")
    n = int(v)
    need(n < 1 << 64, f"bad {what}")
    return n


def json_object(v: Any, what: str) -> dict[str, Any]:
    """`v`, a JSON object the ledger can store and read back (codec.MAX_DEPTH: a file's
    payload a thousand levels deep parsed, then broke every reader of the ledger)."""
    need(isinstance(v, dict), f"bad {what}")
    need(codec.nested_within(v), f"bad {what} (nested deeper than {codec.MAX_DEPTH} levels)")
    try:
        codec.dumps(v)  # what the ledger will store: must serialize again
    except (ValueError, TypeError, RecursionError):
        raise Malformed(f"bad {what}") from None
    return v


def per_generation(v: Any, n: int, what: str) -> list[Any]:
    need(isinstance(v, list) and len(v) == n, f"{what} must list {n} generations")
    return v
