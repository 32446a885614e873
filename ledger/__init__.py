"""The ledger: SQL history of seeds, coefficients, rewards and fingerprints (no torch).

The names below are looked up on first use (PEP 562): importing a light module of the
package (errors, names, records) does not import SQLAlchemy and Alembic with `Ledger`.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from seedledger.ledger.errors import LeaseHeld, RunNotFound, SeedLedgerError, VerifyMismatch
    from seedledger.ledger.ledger import Ledger
    from seedledger.ledger.records import (
        AnchorInfo,
        EventInfo,
        GenerationRecord,
        MemberRecord,
        ReplayStep,
        RunInfo,
        RunSpec,
    )

_WHERE = {
    **dict.fromkeys(("LeaseHeld", "RunNotFound", "SeedLedgerError", "VerifyMismatch"), "seedledger.ledger.errors"),
    "Ledger": "seedledger.ledger.ledger",
    **dict.fromkeys(("AnchorInfo", "EventInfo", "GenerationRecord", "MemberRecord", "ReplayStep", "RunInfo", "RunSpec"),
                    "seedledger.ledger.records"),
}

__all__ = [
    "AnchorInfo",
    "EventInfo",
    "GenerationRecord",
    "Ledger",
    "LeaseHeld",
    "MemberRecord",
    "ReplayStep",
    "RunInfo",
    "RunNotFound",
    "RunSpec",
    "SeedLedgerError",
    "VerifyMismatch",
]


def __getattr__(name: str) -> Any:
    where = _WHERE.get(name)
    if where is None:  # a submodule not imported yet: `from seedledger.ledger import migrate` imports it
        raise AttributeError(f"module 'seedledger.ledger' has no attribute {name!r}")
    value = getattr(importlib.import_module(where), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
