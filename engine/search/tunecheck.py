"""What `tune` accepts of a trial already in the ledger or the study's tables.

A rerun adopts run `STUDY-tNNN` when it carries a matching `tune-trial` event, and finishes
RUNNING trials with the parameters Optuna's tables hold. Both may come from a copied
ledger, so both are data: a trial's parameters must lie in the study file's space (type,
bounds, step, choices), its event must name the same parameters, and its run's stored
config must be the one the study file makes for them (`load_config(config, set + params)`),
so that a planted lr = 5 or a population of 65,536 is refused, not trained. Reward code a
stored config names that the study's own config does not runs only with `trust_code`;
trusting it also accepts the run's `task` and `workers` as stored.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from seedledger.engine.config import TrainConfig, load_config, validate
from seedledger.engine.config_kinds import one_key
from seedledger.engine.runtime import session
from seedledger.engine.runtime.models import adapters
from seedledger.ledger import Ledger
from seedledger.ledger.errors import SeedLedgerError

# keys session.start fills in when the config leaves them open (compared only when set)
_RESOLVED = {"members_per_forward": None, "backend": "auto"}  # key: its value when left open
_CODE_SECTIONS = ("task", "workers")  # what `trust_code` vouches for as stored


class ForeignTrial(SeedLedgerError):
    """A stored trial the study file would not have made. It is refused, not told FAIL: the
    trial stays as it was, and the study goes on once the user removes what was planted."""


def trial_event(ledger: Ledger, run: str) -> dict | None:
    events = ledger.events(run, kind="tune-trial")
    return events[0].payload if events else None


def own_code(config: Path, fixed: list[str]) -> set[str]:
    """The code the study's own config names: the user's, not the ledger's."""
    return set(session.stored_code(load_config(config, fixed).model_dump(mode="json")))


def check_code(ledger: Ledger, run: str, trust_code: bool, own: set[str] = frozenset()) -> None:
    """A trial run may come from a copied ledger: code its stored config names is data."""
    refs = [r for r in session.stored_code(ledger.get_run(run).config) if r not in own]
    try:
        session.check_stored_code(refs, f"run {run}", trust_code)
    except SeedLedgerError as exc:
        raise ForeignTrial(str(exc)) from None


def contains(param: Any, value: Any) -> bool:
    """Whether `value` is one `param` (engine.search.tune.Param) could have drawn."""
    if param.type == "categorical":
        return any(type(c) is type(value) and c == value for c in param.choices or [])
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        return False
    if param.type == "int" and not isinstance(value, int):
        return False
    if not param.low <= value <= param.high:
        return False
    if param.step:
        steps = (value - param.low) / param.step
        return math.isclose(steps, round(steps), abs_tol=1e-9)
    return True


def check_params(run: str, space: dict[str, Any], params: dict[str, Any]) -> None:
    for key, value in params.items():
        if key not in space:
            raise ForeignTrial(f"trial {run}: parameter {key!r} is not in the study's space")
        if not contains(space[key], value):
            raise ForeignTrial(f"trial {run}: {key} = {value!r} is outside the study's space ({_describe(space[key])})")


def _describe(param: Any) -> str:
    if param.type == "categorical":
        return f"choices {param.choices}"
    return f"{param.type} in [{param.low:g}, {param.high:g}]" + (f" step {param.step:g}" if param.step else "")


def expected_config(config: Path, overrides: list[str]) -> TrainConfig:
    """The config `session.start` stores for these overrides, but for what it resolves from
    the model (`_RESOLVED`)."""
    return adapters.resolve(load_config(config, overrides))


def canonical(stored: dict[str, Any]) -> dict[str, Any]:
    """A stored config as this version dumps it, which is what a resume trains: one key for
    the kind, and the keys added since it was stored at their defaults (a study from an
    older version keeps its trials). A config the schema refuses is compared as stored."""
    try:
        return validate(stored, "the stored config").model_dump(mode="json")
    except SeedLedgerError:
        return one_key(stored)


def check_config(ledger: Ledger, run: str, expected: TrainConfig, trust_code: bool,
                 maker: str = "the study file") -> None:
    """The run's stored config is the one `maker` (the study file; `pbt`'s config) makes for
    its parameters, key by key."""
    stored, want = canonical(ledger.get_run(run).config), expected.model_dump(mode="json")
    skip = {k for k, open_value in _RESOLVED.items() if want.get(k) == open_value}
    if trust_code:
        skip |= set(_CODE_SECTIONS)
    for key in sorted(set(want) | set(stored)):
        if key not in skip and stored.get(key) != want.get(key):
            raise ForeignTrial(
                f"run {run}'s stored config is not what {maker} makes for its parameters: {key} is "
                f"{short(stored.get(key))}, {maker} makes {short(want.get(key))}"
            )


def check_stored_trial(
    ledger: Ledger, run: str, number: int, study: str, params: dict[str, Any],
    expected: TrainConfig, trust_code: bool, own: set[str],
) -> None:
    """Everything a rerun reads of an existing trial run, before it builds or trains anything
    (its code first: nothing else it says is acted on before that)."""
    check_code(ledger, run, trust_code, own)
    event = trial_event(ledger, run)
    if event is not None:
        if event.get("study") != study or event.get("trial") != number:
            raise ForeignTrial(f"run {run!r} belongs to study {event.get('study')!r} trial {event.get('trial')}")
        if event.get("params") != params:
            raise ForeignTrial(f"run {run}'s tune-trial event names parameters {short(event.get('params'))}, "
                               f"but trial {number} holds {short(params)}")
    check_config(ledger, run, expected, trust_code)


def short(value: Any, limit: int = 120) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 1] + "…"
