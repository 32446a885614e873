"""Code a stored config would run (invariant: no code named by stored data runs without
the user's trust): a module run's model factory, the reward code its task names, the
module a gymnasium env id names (`gym:MODULE:ENV`: gymnasium imports MODULE to register
ENV) and the Ray cluster it joins, refused unless the user passed --trust-code. Used by
session, evaluation, tune and pbt."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from seedledger.engine.runtime.models.module import stored_refs
from seedledger.ledger.errors import SeedLedgerError
from seedledger.trainers.rewards.loader import is_file_ref
from seedledger.trainers.tasks.registry import LOADERS, code_refs
from seedledger.trainers.tasks.spec_options import expand

GYM = "gym:"  # how a refusal names an env id that imports a module


def stored_code(config: dict) -> list[str]:
    """What a stored config would make this process run that the user did not write: a
    module run's model factory (`module:...`), the reward or fitness code its task names,
    the module of a `gym:MODULE:ENV` env id (`gym:MODULE:ENV (imports MODULE)`), and a Ray
    cluster to join (`workers.address`: a cluster sends back pickled results, so joining
    one is running its code)."""
    refs = stored_refs(config.get("model")) + code_refs(config.get("task"))
    refs += [f"{GYM}{env} (imports {module})" for env, module in env_modules(config.get("task"))]
    workers = config.get("workers")
    if isinstance(workers, dict) and workers.get("address"):
        refs.append(f"workers.address={workers['address']}")
    return refs


def check_stored_code(refs: list[str], owner: str, trust_code: bool) -> None:
    """Refuse to import reward code that a stored config names, or join the Ray cluster it
    names (a ledger or seed file may come from anyone), unless the user passed
    --trust-code; a relative file reference is refused even then, since it would be
    resolved against the working directory."""
    if not refs:
        return
    relative = [
        r for r in refs
        if not r.startswith(("workers.address=", GYM))
        and is_file_ref(_target(r)) and not Path(_target(r)).is_absolute()
    ]
    if relative:
        raise SeedLedgerError(
            f"{owner}'s stored config names reward code by a relative path ({relative[0]!r}); "
            "stored configs name files absolutely, and this one is not resolved against the "
            "working directory"
        )
    if not trust_code:
        named = ", ".join(repr(r) for r in dict.fromkeys(refs))
        raise SeedLedgerError(
            f"{owner}'s stored config names code to run: {named}; code named by a ledger or "
            "seed file runs only with --trust-code (read it first)"
        )


def _target(ref: str) -> str:
    """The module or file part of `module:TARGET:name` / `TARGET:name`."""
    return ref.removeprefix("module:").rpartition(":")[0]


def env_modules(spec: Any) -> list[tuple[str, str]]:
    """(env id, module) of every gymnasium env id in task `spec` that names a module
    (`gym:MODULE:ENV`, in a mix too), without importing anything: `gym.make` imports MODULE
    to register ENV, which is running its code."""
    spec = expand(spec, LOADERS)
    if isinstance(spec, list):
        return [found for item in spec for found in env_modules(item)]
    if isinstance(spec, str):
        name, _, env = spec.partition(":")
    elif isinstance(spec, dict):
        nested = env_modules(spec.get("mix")) + env_modules(spec.get("task"))
        name, env = spec.get("name"), spec.get("path")
        if name != "gym" or not isinstance(env, str):
            return nested
        return nested + _module_of(env)
    else:
        return []
    return _module_of(env) if name == "gym" else []


def _module_of(env: str) -> list[tuple[str, str]]:
    module, sep, _ = env.partition(":")
    return [(env, module)] if sep and module else []
