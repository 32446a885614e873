"""Code a stored config would run (invariant: no code named by stored data runs without
the user's trust): the reward code its task names and the Ray cluster it joins, refused
unless the user passed --trust-code. Used by session, evaluation, tune and pbt."""

from __future__ import annotations

from pathlib import Path

from seedledger.engine.runtime.module_models import stored_refs
from seedledger.ledger.errors import SeedLedgerError
from seedledger.trainers.rewards.loader import is_file_ref
from seedledger.trainers.tasks.registry import code_refs


def stored_code(config: dict) -> list[str]:
    """What a stored config would make this process run that the user did not write: a
    module run's model factory (`module:...`), the reward or fitness code its task names, and a Ray cluster to join (`workers.address`: a cluster
    sends back pickled results, so joining one is running its code)."""
    refs = stored_refs(config.get("model")) + code_refs(config.get("task"))
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
        if not r.startswith("workers.address=") and is_file_ref(_target(r)) and not Path(_target(r)).is_absolute()
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
