"""Errors that mean "bad input": the CLI prints them as one line and exits 2 (or 1)."""


class SeedLedgerError(Exception):
    """Bad input or a refused operation; the message is the one line the user sees."""

    exit_code = 2


class RunNotFound(SeedLedgerError):
    """A run or generation that the ledger does not hold."""


class LeaseHeld(SeedLedgerError):
    """Another live writer holds the run's lease."""


class VerifyMismatch(SeedLedgerError):
    """A fingerprint that differs from the ledger's: the history does not replay.

    `generation` names the first generation that does not replay, where it is known."""

    exit_code = 1

    def __init__(self, message: str, generation: int | None = None):
        super().__init__(message)
        self.generation = generation


class NotVerified(SeedLedgerError):
    """Nothing to check a replay against (no base or generation fingerprint): a failure for
    `verify` and `rebuild`, refused by `import` unless the user allows it."""

    exit_code = 1


class ChainBroken(VerifyMismatch):
    """A generation row that no longer matches its digest in the hash chain (edited by
    hand, or damaged); `generation` names the first such generation."""
