"""`seedledger db upgrade | current | history`: the ledger's schema (ledger.migrate)."""

from __future__ import annotations

import typer

from engine.commands.app import DEFAULT_LEDGER, JsonOpt, LedgerOpt, app, emit

db_app = typer.Typer(help="Ledger schema: upgrade | current | history.", no_args_is_help=True)
app.add_typer(db_app, name="db")


@db_app.command("upgrade")
def db_upgrade(ledger: LedgerOpt = DEFAULT_LEDGER, as_json: JsonOpt = False):
    """Upgrade the ledger's schema to this version's head."""
    from ledger import migrate

    url = ledger or DEFAULT_LEDGER
    result = migrate.upgrade(url)
    backup = str(result.backup) if result.backup else None
    payload = {"before": result.before, "revision": result.after, "backup": backup}
    if result.before == result.after:
        human = f"already at revision {result.after}"
    else:
        human = f"upgraded {result.before or 'an empty ledger'} -> {result.after}"
        human += f"; the old ledger is backed up at {backup}" if backup else " (no backup: nothing to save)"
    emit(payload, as_json, human)


@db_app.command("current")
def db_current(ledger: LedgerOpt = DEFAULT_LEDGER, as_json: JsonOpt = False):
    """Print the ledger's schema revision."""
    from ledger import migrate

    rev = migrate.current(ledger or DEFAULT_LEDGER)
    emit({"revision": rev}, as_json, str(rev))


@db_app.command("history")
def db_history(as_json: JsonOpt = False):
    """List the schema revisions this version knows."""
    from ledger import migrate

    revs = migrate.history()
    emit({"revisions": revs}, as_json, "\n".join(revs))
