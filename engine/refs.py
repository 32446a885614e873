"""Run references: `RUN@G` parsing and lookup (light: no torch, for read-only commands)."""

from __future__ import annotations

from ledger import Ledger, RunInfo
from ledger.errors import RunNotFound, SeedLedgerError


def parse_ref(ref: str) -> tuple[str, int | None]:
    """`RUN@G` → (RUN, G); `RUN` → (RUN, None), meaning its latest generation."""
    name, sep, gen = ref.partition("@")
    if not name:
        raise SeedLedgerError(f"{ref!r}: expected RUN or RUN@G")
    if not sep:
        return name, None
    if not gen.isdigit():
        raise SeedLedgerError(f"{ref!r}: generation must be a non-negative integer")
    return name, int(gen)


def resolve_ref(ledger: Ledger, ref: str) -> tuple[RunInfo, int]:
    """The run and a generation that exists in its lineage (exit 2 naming the latest)."""
    name, gen = parse_ref(ref)
    run = ledger.get_run(name)
    latest = ledger.latest_generation(name)
    if gen is None:
        return run, latest
    if gen > latest:
        raise RunNotFound(f"{name}@{gen} does not exist; the latest generation is {name}@{latest}")
    return run, gen
