"""Run references: `RUN@G` parsing and lookup (light: no torch, for read-only commands)."""

from __future__ import annotations

from seedledger.ledger import Ledger, RunInfo
from seedledger.ledger.errors import RunNotFound, SeedLedgerError


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


def split_member(ref: str) -> tuple[str, int | None]:
    """`RUN@G#M` → (`RUN@G`, M): member M of generation G, i.e. `RUN@G-1` plus that member's
    perturbation (a GA genome, an ES or CMA-ES sample); a ref without `#` → (ref, None)."""
    head, sep, member = ref.partition("#")
    if not sep:
        return ref, None
    name, gen = parse_ref(head)
    if gen == 0:
        raise SeedLedgerError(f"{ref!r}: {name}@0 is the base model, it has no members (G >= 1)")
    if gen is None or not member.isdigit():
        raise SeedLedgerError(f"{ref!r}: a member is named RUN@G#M, with G >= 1 and M a member index")
    return head, int(member)


def resolve_member(ledger: Ledger, ref: str) -> tuple[RunInfo, int, int | None]:
    """The run, generation and member (None for a plain `RUN@G`) that `ref` names; exit 2
    for a member the generation does not have."""
    head, member = split_member(ref)
    run, gen = resolve_ref(ledger, head)
    if member is not None:
        population = ledger.generation(run.name, gen).population
        if member >= population:
            raise SeedLedgerError(f"{ref!r}: {head} has members 0..{population - 1}")
    return run, gen, member


def format_ref(run: str, generation: int, member: int | None = None) -> str:
    """The name a report's (run, generation, member) stands for: `RUN@G` or `RUN@G#M`."""
    return f"{run}@{generation}" if member is None else f"{run}@{generation}#{member}"
