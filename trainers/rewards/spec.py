"""A config's `rewards` list, validated like the rest of the config, without running code.

Each entry is a name (``"task"``, ``"format"``, ``"length"``, ``"contains"``, ``"loglik"``,
``"module:function"``, ``"file.py:function"``) or a mapping with ``fn`` and optionally
``weight`` (a finite number), ``name`` (the component's ledger key; default the reference,
a file's directories left out) and, for the built-ins, their options.
`parse_rewards` checks every key and value and names the entry (``rewards[1] (length):
limit: ...``), so a typo is found when the config loads (exit 2, before a run exists),
not when the first generation is scored. User functions are only named here; importing
them is `loader.load_reward_fn`'s job.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import PurePath
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from seedledger.ledger.errors import SeedLedgerError, did_you_mean

from .loader import is_file_ref

COMMON = ("fn", "name", "weight")


class _Options(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


class NoOptions(_Options):
    """The task's own reward and user functions take no options of their own."""


class FormatOptions(_Options):
    """`trainers.rewards.format.format_reward`'s options."""

    think_start: str | None = "<think>"
    think_end: str | None = "</think>"
    answer_start: str | None = "<answer>"
    answer_end: str | None = "</answer>"
    partial: float = Field(0.5, ge=0.0, le=1.0, allow_inf_nan=False)


class LengthOptions(_Options):
    """`trainers.rewards.length.length_penalty`'s options."""

    limit: int = Field(gt=0, le=10**9)
    unit: Literal["chars", "words"] = "chars"
    scale: float = Field(1.0, allow_inf_nan=False)


class ContainsOptions(_Options):
    """`trainers.rewards.contains.contains_reward`'s options."""

    column: str = Field("answer", min_length=1, max_length=256)
    partial: float = Field(0.5, ge=0.0, le=1.0, allow_inf_nan=False)
    casefold: bool = False


class LoglikOptions(_Options):
    """`trainers.rewards.loglik.LikelihoodReward`'s options: the reference completion is
    `template` with ``{answer}`` replaced by the row's `column` cell."""

    template: str = Field("<answer>{answer}</answer>", min_length=1, max_length=4096)
    column: str = Field("answer", min_length=1, max_length=256)


BUILTIN: dict[str, type[_Options]] = {
    "task": NoOptions, "format": FormatOptions, "length": LengthOptions, "contains": ContainsOptions,
    "loglik": LoglikOptions,
}


@dataclass(frozen=True)
class RewardEntry:
    """One validated entry: `ref` names the function, `options` its keyword arguments."""

    ref: str
    name: str
    weight: float
    options: dict[str, Any]


def parse_rewards(spec: Any) -> list[RewardEntry]:
    """Validate a `rewards` list (SeedLedgerError naming the entry and key otherwise)."""
    if not isinstance(spec, list) or not spec:
        raise SeedLedgerError("rewards: expected a non-empty list")
    entries = [_entry(i, item) for i, item in enumerate(spec)]
    names = [e.name for e in entries]
    if len(set(names)) != len(names):
        raise SeedLedgerError(f"rewards: component names repeat: {names} (give each a 'name')")
    return entries


def _entry(i: int, item: Any) -> RewardEntry:
    opts = {"fn": item} if isinstance(item, str) else dict(item) if isinstance(item, dict) else None
    if opts is None or not isinstance(opts.get("fn"), str) or not opts["fn"]:
        raise SeedLedgerError(f"rewards[{i}]: bad entry {item!r} (expected a name or {{fn: ...}})")
    ref = opts.pop("fn")
    where = f"rewards[{i}] ({ref})"
    weight = opts.pop("weight", 1.0)
    if isinstance(weight, bool) or not isinstance(weight, int | float) or not math.isfinite(weight):
        raise SeedLedgerError(f"{where}: weight must be a finite number, not {weight!r}")
    name = opts.pop("name", _default_name(ref))
    if not isinstance(name, str) or not name:
        raise SeedLedgerError(f"{where}: name must be a non-empty string, not {name!r}")
    model = BUILTIN.get(ref, NoOptions)
    if ref not in BUILTIN and ":" not in ref:
        raise SeedLedgerError(
            f"{where}: unknown reward{did_you_mean(ref, BUILTIN)}; use one of "
            f"{', '.join(BUILTIN)} or 'module:function' / 'file.py:function'"
        )
    allowed = [*COMMON, *model.model_fields]
    for key in opts:
        if key not in model.model_fields:
            raise SeedLedgerError(
                f"{where}: unknown option {key!r}{did_you_mean(key, allowed)}; "
                f"allowed: {', '.join(allowed)}"
            )
    try:
        options = model.model_validate(opts).model_dump(exclude_unset=True)
    except ValidationError as exc:
        err = exc.errors()[0]
        field = ".".join(str(p) for p in err["loc"])
        raise SeedLedgerError(f"{where}: {field}: {err['msg']}") from None
    return RewardEntry(ref, name, float(weight), options)


def _default_name(ref: str) -> str:
    """A component's ledger key when the entry names none: the reference, less the
    directories of a file (made absolute when the config loads, so machine-specific)."""
    target, sep, attr = ref.rpartition(":")
    if sep and is_file_ref(target):
        return f"{PurePath(target).name}:{attr}"
    return ref
