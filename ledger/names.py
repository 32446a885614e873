"""Run names: the one grammar, and the two ways a name leaves the ledger safely.

A run name reaches file paths (`logs/tensorboard/RUN`), terminals and shell commands
(`seedledger resume RUN`), and it arrives from seed files and copied ledgers, so new
names follow one grammar: a letter or digit, then up to 63 letters, digits, `.`, `_` or
`-` (`RUN_NAME_RULE`). That excludes `.`, `..`, `/`, a leading `-` (an option to a
shell), `@` (the `RUN@G` separator), spaces and every control character.

Ledgers written before the grammar may hold other names. They still open, list, show,
verify, export and resume; `valid_run_name` is checked only where a name is created
(train, fork, import). Paths are never built from a raw name: `path_component` gives a
grammatical name as itself and any other name as `run-<hash>`, which stays inside its
directory. To give such a run a grammatical name, fork it with zero generations
(`seedledger fork OLD --run NEW --generations 0`) or export and import it with `--run NEW`.
"""

from __future__ import annotations

import hashlib
import os
import re
from pathlib import Path

from seedledger.ledger.errors import SeedLedgerError

RUN_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
RUN_NAME_RULE = "a letter or digit, then at most 63 letters, digits, '.', '_' or '-'"


def valid_run_name(name: object) -> bool:
    return isinstance(name, str) and RUN_NAME.fullmatch(name) is not None


def check_run_name(name: object) -> str:
    """`name` if it follows the grammar, else SeedLedgerError (one line, the name escaped)."""
    if not valid_run_name(name):
        raise SeedLedgerError(f"bad run name {printable(repr(name))}: {RUN_NAME_RULE}")
    return name  # type: ignore[return-value]


def path_component(name: str) -> str:
    """A file-name component for run `name`: the name itself when it follows the grammar
    (so it can never be `.`, `..` or hold a separator), else `run-` and 16 hex digits of
    its sha256 (an old ledger's name)."""
    if valid_run_name(name):
        return name
    return "run-" + hashlib.sha256(name.encode("utf-8", "surrogatepass")).hexdigest()[:16]


def run_path(base: str | os.PathLike[str], name: str) -> Path:
    """`base/<path_component(name)>`, checked to lie inside `base` (the one way a path is
    built from a run name)."""
    root = Path(base)
    path = root / path_component(name)
    if path.resolve().parent != root.resolve():
        raise SeedLedgerError(f"run {printable(repr(name))} cannot be given a path under {root}")
    return path


_UNSAFE = re.compile(r"[\x00-\x1f\x7f-\x9f\u061c\u200b-\u200f\u2028-\u202e\u2066-\u2069\ufeff\ud800-\udfff]")


def printable(text: object, limit: int | None = 200, newlines: bool = False) -> str:
    """`text` fit for a terminal: control characters (C0, DEL, C1: ANSI and OSC escapes
    start with them), bidirectional overrides, zero-width characters and lone surrogates become `\\x1b`-style
    escapes (line breaks too, unless `newlines`), and the result is cut to about `limit`
    characters (None: not cut). Not a quoting for shells."""
    s = str(text)
    if limit is not None and len(s) > limit:
        s = s[:limit] + "…"

    def esc(m: re.Match[str]) -> str:
        c = m.group()
        if newlines and c == "\n":
            return c
        return f"\\x{ord(c):02x}" if ord(c) < 0x100 else f"\\u{ord(c):04x}"

    return _UNSAFE.sub(esc, s)
