"""Options on a string-form task: ``"jsonl:PATH?test_size=8&match=numeric"``, and the
mapping ``--set task.test_size=8`` makes of ``task: jsonl:PATH`` (``{name: "jsonl:PATH",
test_size: 8}``), both mean ``{name: jsonl, path: PATH, test_size: 8}``.

Why: the string form is the short way to name a file, and without this it could not change
a single setting (a 30-row file needs a smaller ``test_size``). A plain ``"jsonl:PATH"`` is
left a string, so stored configs keep their shape. Values are YAML scalars, as with
``--set``; ``rewards`` and ``mix`` need the mapping form (code references stay visible).
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Any

import yaml

from seedledger.ledger.errors import SeedLedgerError

_MAPPING_ONLY = ("rewards", "mix", "name", "path")


def expand(spec: Any, names: Collection[str]) -> Any:
    """``spec`` as a mapping when it is a string form with options (``?k=v&...``) or a
    mapping whose ``name`` is a string form; anything else unchanged. ``names`` are the
    known task names (a string whose prefix is not one is left for the loader to judge)."""
    if isinstance(spec, str):
        head, sep, query = spec.rpartition("?")
        opts = _query(spec, query) if sep else None
        if opts is None:
            return spec
        base = _name_and_path(head, names)
        return spec if base is None else {**base, **opts}
    if isinstance(spec, dict) and isinstance(spec.get("name"), str):
        inner = expand(spec["name"], names)
        base = inner if isinstance(inner, dict) else _name_and_path(spec["name"], names)
        if base is not None and base != {"name": spec["name"]}:
            return {**base, **{k: v for k, v in spec.items() if k != "name"}}
    return spec


def _name_and_path(text: str, names: Collection[str]) -> dict[str, Any] | None:
    name, colon, path = text.partition(":")
    if name not in names:
        return None
    return {"name": name, "path": path} if colon and path else {"name": name}


def _query(spec: str, query: str) -> dict[str, Any] | None:
    """``k=v&k=v`` as a dict; None when the text after ``?`` is not that (part of a path)."""
    pairs = [part.partition("=") for part in query.split("&")]
    if not query or any(not sep or not key.isidentifier() for key, sep, _ in pairs):
        return None
    opts: dict[str, Any] = {}
    for key, _, value in pairs:
        if key in _MAPPING_ONLY:
            raise SeedLedgerError(
                f"task {spec[:80]!r}: {key!r} cannot be given after '?'; write the task as a "
                "mapping ({name: ..., path: ..., " + key + ": ...})"
            )
        try:
            opts[key] = yaml.safe_load(value) if value else value
        except yaml.YAMLError:
            opts[key] = value
    return opts
