"""Commands that move seed files: `export` (a run's lineage to a file) and `import` (a
file as a run). The work is ledger.seedio.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from engine.commands.app import (
    DEFAULT_LEDGER,
    AllowUnverified,
    JsonOpt,
    LedgerOpt,
    app,
    emit,
    open_ledger,
)
from ledger.seedio import IMPORT_MAX_MEMBERS  # light: no torch


@app.command()
def export(
    ref: Annotated[str, typer.Argument(help="RUN@G to export with its whole lineage.")],
    output: Annotated[Path, typer.Option("-o", "--output", help="FILE.seeds to write.")],
    force: Annotated[
        bool, typer.Option("--force", help="Replace FILE if it exists (never a directory or a ledger).")
    ] = False,
    ledger: LedgerOpt = DEFAULT_LEDGER,
    as_json: JsonOpt = False,
):
    """Write RUN@G as a seed file: keys and coefficients, kilobytes instead of gigabytes."""
    from engine.refs import resolve_ref
    from ledger.seedio import export_seedfile
    from replay.noise import member_key

    with open_ledger(ledger) as led:
        run, gen = resolve_ref(led, ref)
        export_seedfile(led, run.name, gen, output, key_fn=member_key, force=force)
    payload = {"run": run.name, "generation": gen, "file": str(output), "bytes": output.stat().st_size}
    emit(payload, as_json, f"wrote {output} ({payload['bytes']:,} bytes) for {run.name}@{gen}")


@app.command("import")
def import_(
    file: Annotated[Path, typer.Argument(help="FILE.seeds to import as a run.")],
    run: Annotated[str | None, typer.Option("--run", help="Name for the imported run.")] = None,
    allow_unverified: AllowUnverified = False,
    max_members: Annotated[
        int, typer.Option("--max-members", min=1, help="Refuse a file holding more members than this.")
    ] = IMPORT_MAX_MEMBERS,
    ledger: LedgerOpt = DEFAULT_LEDGER,
    as_json: JsonOpt = False,
):
    """Import a seed file into the ledger as a run (refused when it lacks fingerprints,
    unless --allow-unverified, or holds more than --max-members members)."""
    from ledger.seedio import import_seedfile
    from replay.noise import member_key
    from replay.seedcheck import check_seedfile

    with open_ledger(ledger, create=True) as led:
        info = import_seedfile(
            led, file, run, key_fn=member_key, allow_unverified=allow_unverified,
            check=check_seedfile, max_members=max_members,
        )
        latest = led.latest_generation(info.name)
        why = led.events(info.name, "import")[-1].payload.get("not_verified")
    payload = {"run": info.name, "latest_generation": latest, "verified": why is None}
    if why is not None:
        payload["not_verified"] = why
    note = f" (NOT VERIFIED: {why})" if why is not None else ""
    emit(payload, as_json, f"imported {info.name}@{latest}{note}")
