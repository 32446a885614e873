"""What the `seedledger` commands use of the runtime beside the API proper, so engine/cli
reaches engine.runtime through engine.api, or for its console plumbing (Ctrl-C and
SIGTERM, the live progress table, library chatter) through the runtime package's own
exports (engine/runtime/__init__.py), never a room (tests/test_layout.py). Public like
`ledger_for_call` (re-exported, not in `__all__`); each import is lazy, so
`import seedledger` loads no more than before."""

from __future__ import annotations

import os
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

from seedledger.ledger import Ledger


def check_device(name: str) -> str:
    """`name` when torch can place tensors there, else SeedLedgerError saying why: the one
    device check (engine.runtime.setup.devices), run before any work."""
    from seedledger.engine.runtime.setup.devices import check_device as check

    return check(name)


def anchors_dir(ledger: Ledger) -> Path:
    """Where `ledger` keeps its anchors: beside a SQLite ledger, else under $SEEDLEDGER_HOME."""
    from seedledger.engine.runtime.dirs import anchors_dir as where

    return where(ledger)


def describe_model(provenance: dict[str, Any] | None) -> str:
    """One phrase naming the artefact a recorded base-model provenance points to."""
    from seedledger.engine.runtime.models.provenance import describe

    return describe(provenance)


def stored_code(config: dict) -> list[str]:
    """What a stored config would run that the user did not write (a module run's factory,
    reward or fitness code, a gym env's module, a Ray cluster): what `--trust-code` allows."""
    from seedledger.engine.runtime.setup.stored_code import stored_code as refs

    return refs(config)


def removed_if_unused(location: str | os.PathLike[str]) -> AbstractContextManager[None]:
    """Around code that creates the SQLite ledger at `location`: if the code fails and the
    new file holds no run, the file is deleted (a failed first command leaves no ledger)."""
    from seedledger.engine.runtime.setup.fresh_ledger import removed_if_unused as removed

    return removed(location)


__all__ = ["anchors_dir", "check_device", "describe_model", "removed_if_unused", "stored_code"]
