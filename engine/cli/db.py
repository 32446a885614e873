"""`seedledger db upgrade | current | history`: the ledger's schema (ledger.migrate)."""

from __future__ import annotations

import typer

from seedledger.engine.cli.app import DEFAULT_LEDGER, JsonOpt, LedgerOpt, app, emit

db_app = typer.Typer(help="Ledger schema: upgrade | current | history.", no_args_is_help=True, rich_markup_mode=None)
app.add_typer(db_app, name="db")


@db_app.command("upgrade")
def db_upgrade(ledger: LedgerOpt = DEFAULT_LEDGER, as_json: JsonOpt = False):
    """Upgrade the ledger's schema to this version's head (creates a missing ledger)."""
    from seedledger.ledger import migrate

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
    """Print the ledger's schema revision (a missing ledger is an error, as for every reader)."""
    from seedledger.ledger import migrate
    from seedledger.ledger.db import sqlite_path, to_url
    from seedledger.ledger.errors import SeedLedgerError

    location = ledger or DEFAULT_LEDGER
    path = sqlite_path(to_url(location))
    if path is not None and not path.exists():
        raise SeedLedgerError(f"no ledger at {location}")
    rev, head = migrate.current(location), migrate.head()
    payload = {"revision": rev, "head": head, "up_to_date": rev == head}
    if rev is None:
        human = f"empty: no schema yet (`seedledger db upgrade --ledger {location}` creates it)"
    else:
        human = rev if rev == head else f"{rev} (this seedledger's head is {head}: `seedledger db upgrade`)"
    emit(payload, as_json, human)


@db_app.command("history")
def db_history(as_json: JsonOpt = False):
    """List the schema revisions this version knows, oldest first."""
    from seedledger.ledger import migrate

    revs = [{"revision": rev, "title": title} for rev, title in migrate.revisions()]
    emit({"revisions": revs, "head": migrate.head()}, as_json,
         "\n".join(f"{r['revision']}  {r['title']}" for r in revs))
