"""Reading local dataset files (jsonl / json lines, parquet) into rows, with one-line errors.

Every problem with a file becomes a ``SeedLedgerError`` naming the file, and where it
applies the row (0-based) and the column, e.g. ``data.jsonl: row 3: column 'nums': expected
a list of integers, got 'x'``. JSON lines are parsed line by line with ``json`` (so a
malformed line is named exactly); parquet goes through ``datasets``. Nothing is executed.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from seedledger.ledger.errors import SeedLedgerError

DATA_SUFFIXES = (".jsonl", ".json", ".ndjson", ".parquet", ".pq")

Check = Callable[[Any], Any]
"""Converts a cell to the expected type, or raises ValueError with what was expected."""


def read_rows(path: str | Path) -> list[dict[str, Any]]:
    """All rows of a ``.jsonl``/``.json``/``.parquet`` file as dicts."""
    p = Path(path)
    if p.is_dir():
        inside = sorted(f.name for f in p.iterdir() if f.suffix.lower() in DATA_SUFFIXES)
        named = f" (it holds {', '.join(inside[:3])}{', ...' if len(inside) > 3 else ''})" if inside else ""
        raise SeedLedgerError(f"{p}: a directory, not a dataset file: name one .jsonl or .parquet file{named}")
    if not p.is_file():
        raise SeedLedgerError(f"{p}: no such dataset file")
    suffix = p.suffix.lower()
    if suffix in (".jsonl", ".json", ".ndjson"):
        return _read_jsonl(p)
    if suffix in (".parquet", ".pq"):
        return _read_parquet(p)
    raise SeedLedgerError(f"{p}: unknown dataset format {suffix!r} (use .jsonl or .parquet)")


def _read_jsonl(p: Path) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    try:
        with p.open("r", encoding="utf-8") as f:
            for lineno, line in enumerate(f):
                if not line.strip():
                    continue
                try:
                    row = json.loads(line)
                except json.JSONDecodeError as exc:
                    raise SeedLedgerError(
                        f"{p}: row {len(rows)} (line {lineno + 1}): malformed JSON: {exc.msg}"
                    ) from None
                if not isinstance(row, dict):
                    raise SeedLedgerError(
                        f"{p}: row {len(rows)} (line {lineno + 1}): expected a JSON object, got {type(row).__name__}"
                    )
                rows.append(row)
    except UnicodeDecodeError as exc:
        raise SeedLedgerError(f"{p}: not UTF-8 text ({exc.reason} at byte {exc.start})") from None
    except OSError as exc:
        raise SeedLedgerError(f"{p}: cannot read: {exc.strerror}") from None
    return rows


def _read_parquet(p: Path) -> list[dict[str, Any]]:
    try:
        from datasets import Dataset

        ds = Dataset.from_parquet(str(p), keep_in_memory=True)
    except Exception as exc:
        msg = f"{type(exc).__name__}: {exc}".splitlines()[0]
        raise SeedLedgerError(f"{p}: cannot read parquet: {msg}") from None
    return ds.to_list()


def check_columns(
    rows: list[dict[str, Any]], path: str | Path, checks: dict[str, Check]
) -> list[dict[str, Any]]:
    """Rows with each named column converted by its check; the first bad cell raises."""
    if not rows:
        raise SeedLedgerError(f"{path}: dataset is empty (no rows)")
    out = []
    for i, row in enumerate(rows):
        new = dict(row)
        for col, check in checks.items():
            if col not in row:
                have = ", ".join(sorted(map(str, row))) or "none"
                raise SeedLedgerError(f"{path}: row {i}: missing column {col!r} (columns: {have})")
            try:
                new[col] = check(row[col])
            except (ValueError, TypeError) as exc:
                raise SeedLedgerError(
                    f"{path}: row {i}: column {col!r}: {exc}, got {_short(row[col])}"
                ) from None
        out.append(new)
    return out


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def as_int(value: Any) -> int:
    if isinstance(value, bool):
        raise ValueError("expected an integer")
    if isinstance(value, int):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    raise ValueError("expected an integer")


def as_int_list(value: Any) -> list[int]:
    if hasattr(value, "tolist"):
        value = value.tolist()
    if not isinstance(value, list | tuple) or not value:
        raise ValueError("expected a non-empty list of integers")
    try:
        return [as_int(v) for v in value]
    except ValueError:
        raise ValueError("expected a non-empty list of integers") from None


def as_text(value: Any) -> str:
    if not isinstance(value, str) or not value.strip():
        raise ValueError("expected non-empty text")
    return value


def as_scalar_text(value: Any) -> str:
    """A string, or a number written as a string (answers may be stored either way)."""
    if isinstance(value, bool) or value is None:
        raise ValueError("expected text or a number")
    if isinstance(value, int | float):
        return str(value)
    return as_text(value)
