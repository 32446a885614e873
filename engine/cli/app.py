"""The `seedledger` typer app: root options, shared option types, output, error mapping.

Every command takes `--ledger` (default `$SEEDLEDGER_DB` or `./seedledger.db`) and `--json`.
Exit codes: 0 ok, 1 failure (verify mismatch), 2 bad input (one line on stderr).
The commands register themselves on `app` from the modules of engine.cli.
"""

from __future__ import annotations

import json
import os
import re
import sys
import traceback
from typing import Annotated, Any

import typer

try:  # typer >= 0.20 carries its own copy of click; its exceptions are these
    from typer._click.exceptions import ClickException, NoArgsIsHelpError, UsageError
except ImportError:  # older typer runs on click itself
    from click.exceptions import ClickException, NoArgsIsHelpError, UsageError

from seedledger.ledger.errors import SeedLedgerError

DEFAULT_LEDGER = "seedledger.db"  # typer reads $SEEDLEDGER_DB first

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    rich_markup_mode=None,  # plain help: typer's rich panels label every flag `<bool>`
    help="ES fine-tuning of language models whose training history is a SQL ledger of seeds.",
)

LedgerOpt = Annotated[
    str,
    typer.Option("--ledger", envvar="SEEDLEDGER_DB", help="Ledger path or SQLAlchemy URL."),
]
JsonOpt = Annotated[bool, typer.Option("--json", help="One JSON document on stdout.")]
AllowUnverified = Annotated[
    bool,
    typer.Option(
        "--allow-unverified",
        help="Accept a history with no fingerprint to check it against (base or generation).",
    ),
]


class State:
    debug = False
    upgrade = True


def _version(value: bool) -> None:
    if value:
        from seedledger.engine import __version__

        typer.echo(f"seedledger {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    debug: Annotated[bool, typer.Option("--debug", help="Tracebacks on errors.")] = False,
    verbose: Annotated[bool, typer.Option(
        "--verbose", help="Libraries' own log lines too (vLLM's start-up and loading), on stderr.")] = False,
    no_upgrade: Annotated[
        bool,
        typer.Option("--no-upgrade", help="Refuse a ledger with an older schema instead of upgrading it."),
    ] = False,
    version: Annotated[bool, typer.Option(
        "--version", callback=_version, is_eager=True, help="Print the version and exit.")] = False,
):
    State.debug = debug
    State.upgrade = not no_upgrade
    if verbose:  # read where a library starts (engine.runtime.backends.vllm_env)
        os.environ["SEEDLEDGER_VERBOSE"] = "1"


def emit(payload: Any, as_json: bool, human: str | None = None) -> None:
    """Print a result: JSON when asked, otherwise the human text."""
    if as_json:
        sys.stdout.write(json.dumps(payload, indent=2, default=str) + "\n")
    elif human is not None:
        from seedledger.ledger.names import printable

        typer.echo(printable(human, limit=None, newlines=True))  # names from foreign files


def open_ledger(url: str, create: bool = False):
    """Open the ledger; only commands that write a new run (train, import) may create one,
    so a mistyped `--ledger` is reported instead of becoming an empty ledger."""
    from seedledger.ledger import Ledger

    ledger = Ledger.open(url or DEFAULT_LEDGER, upgrade=State.upgrade, create=create)
    if ledger.upgraded is not None and ledger.upgraded.changed:
        print(ledger.upgraded.describe(), file=sys.stderr)  # the schema changed: say so, and where the backup is
    return ledger


def _usage_error(exc: UsageError) -> None:
    """A usage error as one line on stderr (click's usage block only under --debug)."""
    if isinstance(exc, NoArgsIsHelpError):  # `seedledger` alone: the help
        typer.echo(exc.format_message())
        sys.exit(0)
    if State.debug:
        exc.show()
        sys.exit(2)
    message = " ".join(exc.format_message().split())
    where = exc.ctx.command_path if exc.ctx is not None else "seedledger"
    extra = re.search(r"unexpected extra arguments?(?:\(s\))? \(([^\s)]+=[^\s)]*)", message)
    if extra:  # `--set a=1 b=2`
        message += f"; one --set per key, e.g. --set {extra[1]}"
    say(f"error: {message} (see `{where} --help`)")
    sys.exit(2)


def say(line: str) -> None:
    """One line on stderr, fit for a terminal: whitespace collapsed, control characters
    escaped (ledger.names.printable), URL passwords masked (ledger.db.redact)."""
    from seedledger.ledger.db import redact
    from seedledger.ledger.names import printable

    typer.echo(printable(redact(" ".join(line.split())), limit=2000), err=True)


def _warning_line(message, category, filename, lineno, line=None) -> str:
    """Python warnings as one escaped line (they may quote names from a ledger)."""
    from seedledger.ledger.db import redact
    from seedledger.ledger.names import printable

    return printable(redact(f"warning: {' '.join(str(message).split())}"), limit=2000) + "\n"


def main(argv: list[str] | None = None) -> None:
    """Console-script entry point: map errors to one line and an exit code (`SystemExit`).
    `argv` defaults to the command line; tests pass it to run a command in process."""
    import warnings

    from seedledger.engine.runtime import RunInterrupted, quiet_hf_env

    quiet_hf_env()  # no hub, no library progress bars: an error must stay one line
    warnings.formatwarning = _warning_line
    try:
        code = app(args=argv, prog_name="seedledger", standalone_mode=False)
    except RunInterrupted as exc:  # SIGINT / SIGTERM during train, resume or fork
        say(str(exc))
        # objects the interrupt left half-built (llvmlite's, inside numba's JIT) complain in
        # their finalizers at exit; the run is recorded and the one line said
        sys.unraisablehook = lambda _unraisable: None
        sys.exit(exc.exit_code)
    except SeedLedgerError as exc:
        if State.debug:
            traceback.print_exc()
        say(f"error: {exc}")
        sys.exit(exc.exit_code)
    except UsageError as exc:
        _usage_error(exc)
    except (typer.Abort, KeyboardInterrupt):
        say("interrupted")
        sys.exit(130)
    except typer.Exit as exc:
        sys.exit(exc.exit_code)
    except ClickException as exc:  # e.g. a file option that cannot be opened
        if State.debug:
            raise
        say(f"error: {exc.format_message()}")
        sys.exit(2)
    except OSError as exc:  # the environment: a missing or read-only directory, a full disk
        if State.debug:
            raise
        where = f": {exc.filename}" if exc.filename else ""
        say(f"error: {exc.strerror or exc}{where}")
        sys.exit(2)
    except Exception as exc:
        if State.debug:
            raise
        say(f"error: {type(exc).__name__}: {exc} (run with --debug for a traceback)")
        sys.exit(1)
    if isinstance(code, int) and not isinstance(code, bool) and code:
        # typer returns 130 for a KeyboardInterrupt outside a training session
        if code == 130:
            say("interrupted")
        sys.exit(code)
