"""`seedledger rm RUN`: delete a run, e.g. one whose settings failed before it trained.

Refused when the run has forks (their history starts in it) or while another process
trains it; a run with generations of its own needs `--force` (export it first to keep it
as a seed file). Its rows go in one transaction, with a `run-deleted` event; then the
anchor files no other run uses are removed from the anchors directory.
"""

from __future__ import annotations

from typing import Annotated

import typer

from seedledger.engine.cli.app import (
    DEFAULT_LEDGER,
    JsonOpt,
    LedgerOpt,
    app,
    emit,
    open_ledger,
)


@app.command()
def rm(
    run: Annotated[str, typer.Argument(help="Run to delete.")],
    force: Annotated[
        bool, typer.Option("--force", help="Delete it even if it has generations of its own.")
    ] = False,
    ledger: LedgerOpt = DEFAULT_LEDGER,
    as_json: JsonOpt = False,
):
    """Delete RUN and its generations (refused while it has forks or is training)."""
    from seedledger.engine.api import anchors_dir
    from seedledger.ledger.errors import SeedLedgerError
    from seedledger.replay.anchors import remove_unused

    with open_ledger(ledger) as led:
        info = led.get_run(run)
        kids = [name for name, _ in led.children(run)]
        if kids:
            raise SeedLedgerError(f"run {run!r} has forks ({', '.join(kids)}): `seedledger rm` them first")
        own = led.latest_generation(run) - info.parent_generation
        if own and not force:
            raise SeedLedgerError(
                f"run {run!r} has {own} generation{'s' if own != 1 else ''} of its own; pass --force "
                f"to delete them (`seedledger export {run} -o {run}.seeds` keeps a copy)"
            )
        payload = led.delete_run(run, reason="seedledger rm")
        removed = remove_unused(led, payload["anchors"], anchors_dir(led))
    payload["anchor_files_removed"] = [str(p) for p in removed]
    files = f", {len(removed)} anchor file{'s' if len(removed) != 1 else ''}" if removed else ""
    emit(payload, as_json, f"deleted run {run} ({own} generation{'s' if own != 1 else ''}{files})")
