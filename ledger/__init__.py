"""The ledger: SQL history of seeds, coefficients, rewards and fingerprints (no torch)."""

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
