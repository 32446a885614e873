"""A config's validation errors as the one line a user reads: each field's most specific
error, blamed on the `--set` that wrote the key (else the file), with "did you mean" for a
mistyped key. Kept apart from engine.config so the schema reads as a schema."""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any, get_args

from pydantic import BaseModel

from seedledger.ledger.errors import did_you_mean


def report(errors: list[dict[str, Any]], source: str, overrides: Sequence[str], root: type[BaseModel]) -> str:
    """All of a validation's errors as one line, the most specific one per field; `root`
    is the validated model (the keys it allows are the "did you mean" candidates)."""
    by_field: dict[tuple, list[dict[str, Any]]] = {}
    for err in errors:
        by_field.setdefault(_path(err["loc"])[:1], []).append(err)
    lines = [_describe(_most_specific(errs), source, overrides, root) for errs in by_field.values()]
    return lines[0] if len(lines) == 1 else f"{len(lines)} config errors: " + "; ".join(lines)


def _describe(err: dict[str, Any], source: str, overrides: Sequence[str], root: type[BaseModel]) -> str:
    path = _path(err["loc"]) + tuple(err.get("ctx", {}).get("key_path", ()))  # keys inside a free-form value
    where = ".".join(map(str, path))
    reason = err["msg"].removeprefix("Value error, ")
    if err["type"] == "extra_forbidden":
        reason = "unknown key" + did_you_mean(str(path[-1]), _keys_at(root, path[:-1]))
    blame = (_blame(where, overrides) if where else _blame_named(reason, overrides)) or source
    return f"{blame}: {where}: {reason}" if where else f"{blame}: {reason}"


def _path(loc: tuple) -> tuple:
    """A pydantic error location as config keys (union branch names dropped)."""
    return tuple(p for p in loc if not _is_union_tag(p))


def _blame(where: str, overrides: Sequence[str]) -> str | None:
    """`--set KEY=VALUE`, the last override that wrote `where` or a mapping above or below it."""
    for item in reversed(overrides):
        key = item.partition("=")[0].strip()
        if where and (key == where or where.startswith(key + ".") or key.startswith(where + ".")):
            return f"--set {item}"
    return None


def _blame_named(reason: str, overrides: Sequence[str]) -> str | None:
    """For a rule between keys (no one field's error): the last `--set` whose key the
    message names ("population must be even when mirrored" after `--set population=5`)."""
    for item in reversed(overrides):
        key = item.partition("=")[0].strip()
        if key and re.search(rf"(?<![\w.]){re.escape(key)}(?![\w])", reason):
            return f"--set {item}"
    return None


def _keys_at(root: type[BaseModel], path: tuple) -> list[str]:
    """The config keys allowed at `path` below `root` (for "did you mean")."""
    model: Any = root
    for part in path:
        fields = getattr(model, "model_fields", {})
        if part not in fields:
            return []
        model = _model_of(fields[part].annotation)
    return list(getattr(model, "model_fields", {}))


def _model_of(annotation: Any) -> Any:
    """The pydantic model inside an annotation (`X | None`, `Annotated[...]`), if any."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in get_args(annotation):
        found = _model_of(arg)
        if found is not None:
            return found
    return None



def _is_union_tag(part: Any) -> bool:
    """pydantic names a union's branches in error locations (`literal['full']`, `LowRank`);
    config keys are lower-case, so these are told apart by their first character."""
    return isinstance(part, str) and (part.startswith("literal[") or part[:1].isupper())


def _most_specific(errors: list[dict[str, Any]]) -> dict[str, Any]:
    """The error to report for one field: for a union, the branch that got furthest into
    the value (a mapping's bad key rather than "should be 'full'")."""
    return max(errors, key=lambda e: len(_path(e["loc"])))
