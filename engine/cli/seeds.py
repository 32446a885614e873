"""Commands that move seed files: `export` (a run's lineage to a file) and `import` (a
file as a run). The work is engine.api (ledger.seedio).
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from seedledger.engine.cli.app import (
    DEFAULT_LEDGER,
    AllowUnverified,
    JsonOpt,
    LedgerOpt,
    app,
    emit,
    open_ledger,
)
from seedledger.ledger.seedformat import IMPORT_MAX_MEMBERS  # light: no SQL, no numpy


@app.command()
def export(
    ref: Annotated[str, typer.Argument(help="RUN@G to export with its whole lineage, or RUN@G#M: one member.")],
    output: Annotated[Path, typer.Option("-o", "--output", help="FILE.seeds to write.")],
    force: Annotated[
        bool, typer.Option("--force", help="Replace FILE if it exists (never a directory or a ledger).")
    ] = False,
    with_history: Annotated[
        bool, typer.Option("--with-history", help="Also write FILE.seeds.history beside it: the lineage's rewards, "
                           "batches, events and evaluations, which `import` restores.")
    ] = False,
    ledger: LedgerOpt = DEFAULT_LEDGER,
    as_json: JsonOpt = False,
):
    """Write RUN@G as a seed file: keys and coefficients, kilobytes instead of gigabytes.
    RUN@G#M names member M of generation G (RUN@G-1 plus its perturbation): `rebuild` takes
    that file, `import` refuses it (a member is weights, not a run's history)."""
    from seedledger.engine import api

    with open_ledger(ledger) as led:
        payload = api.export(ref, output, ledger=led, force=force, with_history=with_history)
    from seedledger.engine.refs import format_ref

    named = format_ref(payload["run"], payload["generation"], payload.get("member"))
    also = f" and {payload['history']} ({payload['history_bytes']:,} bytes)" if with_history else ""
    emit(payload, as_json, f"wrote {output} ({payload['bytes']:,} bytes){also} for {named}")


@app.command("import")
def import_(
    file: Annotated[Path, typer.Argument(help="FILE.seeds to import as a run.")],
    run: Annotated[str | None, typer.Option("--run", help="Name for the imported run.")] = None,
    allow_unverified: AllowUnverified = False,
    max_members: Annotated[
        int, typer.Option("--max-members", min=1, help="Refuse a file holding more members than this.")
    ] = IMPORT_MAX_MEMBERS,
    history: Annotated[
        Path | None, typer.Option("--history", help="The seed file's history file, restored with it (default: "
                                  "FILE.seeds.history when it exists).")
    ] = None,
    ledger: LedgerOpt = DEFAULT_LEDGER,
    as_json: JsonOpt = False,
):
    """Import a seed file into the ledger as a run (refused when it lacks fingerprints,
    unless --allow-unverified, or holds more than --max-members members), with the
    rewards, batches and events of its history file when it has one."""
    from seedledger.engine import api

    with open_ledger(ledger, create=True) as led:
        payload = api.import_seeds(file, run, ledger=led, allow_unverified=allow_unverified,
                                   max_members=max_members, history=history)
    note = f" (NOT VERIFIED: {payload['not_verified']})" if not payload["verified"] else ""
    restored = f" with its history from {payload['history']}" if "history" in payload else ""
    emit(payload, as_json, f"imported {payload['run']}@{payload['latest_generation']}{restored}{note}")
