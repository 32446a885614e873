"""Is stdout a terminal, and one flushed line for a log: what both training's progress
(`progress`) and model provisioning (`models`) need, without provisioning importing the
training display."""

from __future__ import annotations

import sys


def interactive() -> bool:
    """Whether stdout is a terminal (live bars) rather than a log (plain lines)."""
    return sys.stdout.isatty()


def line(text: str) -> None:
    """One progress line for a log: on stdout, flushed at once."""
    print(text, file=sys.stdout, flush=True)
