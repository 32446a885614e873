"""The `seedledger` command line: the stable contract of DESIGN.md.

Every command takes `--ledger` (default `$SEEDLEDGER_DB` or `./seedledger.db`) and `--json`.
Exit codes: 0 ok, 1 failure (verify mismatch), 2 bad input (one line on stderr).
"""

from __future__ import annotations

import json
import os
import sys
import traceback
from typing import Annotated, Any

import typer

from ledger.errors import SeedLedgerError

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    help="ES fine-tuning of language models whose training history is a SQL ledger of seeds.",
)
db_app = typer.Typer(help="Ledger schema: upgrade | current | history.", no_args_is_help=True)
app.add_typer(db_app, name="db")

LedgerOpt = Annotated[
    str,
    typer.Option("--ledger", envvar="SEEDLEDGER_DB", help="Ledger path or SQLAlchemy URL."),
]
JsonOpt = Annotated[bool, typer.Option("--json", help="One JSON document on stdout.")]


class State:
    debug = False


@app.callback()
def _root(debug: Annotated[bool, typer.Option("--debug", help="Tracebacks on errors.")] = False):
    State.debug = debug


def emit(payload: Any, as_json: bool, human: str | None = None) -> None:
    """Print a result: JSON when asked, otherwise the human text."""
    if as_json:
        sys.stdout.write(json.dumps(payload, indent=2, default=str) + "\n")
    elif human is not None:
        typer.echo(human)


def not_built(name: str) -> None:
    raise SeedLedgerError(f"`seedledger {name}` is not built yet")


def main() -> None:
    """Console-script entry point: map errors to one line and an exit code."""
    State.debug = "--debug" in sys.argv
    try:
        app(standalone_mode=False)
    except SeedLedgerError as exc:
        if State.debug:
            traceback.print_exc()
        typer.echo(f"error: {exc}", err=True)
        sys.exit(exc.exit_code)
    except (typer.Abort, KeyboardInterrupt):
        typer.echo("aborted", err=True)
        sys.exit(130)
    except typer.Exit as exc:
        sys.exit(exc.exit_code)
    except Exception as exc:  # click usage errors carry their own exit code
        code = getattr(exc, "exit_code", None)
        if code is not None and hasattr(exc, "show"):
            exc.show()
            sys.exit(2)
        if State.debug:
            raise
        typer.echo(f"error: {type(exc).__name__}: {exc} (run with --debug for a traceback)", err=True)
        sys.exit(1)


DEFAULT_LEDGER = os.environ.get("SEEDLEDGER_DB", "seedledger.db")
