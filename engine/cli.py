"""The `seedledger` command line: the stable contract of DESIGN.md.

Every command takes `--ledger` (default `$SEEDLEDGER_DB` or `./seedledger.db`) and `--json`.
Exit codes: 0 ok, 1 failure (verify mismatch), 2 bad input (one line on stderr).
"""

from __future__ import annotations

import json
import sys
import traceback
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any

import typer

try:  # typer >= 0.20 carries its own copy of click; its exceptions are these
    from typer._click.exceptions import ClickException, NoArgsIsHelpError, UsageError
except ImportError:  # older typer runs on click itself
    from click.exceptions import ClickException, NoArgsIsHelpError, UsageError

from ledger.errors import SeedLedgerError

DEFAULT_LEDGER = "seedledger.db"  # typer reads $SEEDLEDGER_DB first

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
    upgrade = True


@app.callback()
def _root(
    debug: Annotated[bool, typer.Option("--debug", help="Tracebacks on errors.")] = False,
    no_upgrade: Annotated[
        bool,
        typer.Option("--no-upgrade", help="Refuse a ledger with an older schema instead of upgrading it."),
    ] = False,
):
    State.debug = debug
    State.upgrade = not no_upgrade


def emit(payload: Any, as_json: bool, human: str | None = None) -> None:
    """Print a result: JSON when asked, otherwise the human text."""
    if as_json:
        sys.stdout.write(json.dumps(payload, indent=2, default=str) + "\n")
    elif human is not None:
        typer.echo(human)



Sets = Annotated[
    list[str] | None, typer.Option("--set", help="Override a config key: key=value (dots for nesting).")
]
Gens = Annotated[int | None, typer.Option("--generations", "-n", help="Generations to train.")]


def open_ledger(url: str, create: bool = False):
    """Open the ledger; only commands that write a new run (train, import) may create one,
    so a mistyped `--ledger` is reported instead of becoming an empty ledger."""
    from ledger import Ledger

    ledger = Ledger.open(url or DEFAULT_LEDGER, upgrade=State.upgrade, create=create)
    if ledger.upgraded is not None and ledger.upgraded.changed:
        print(ledger.upgraded.describe(), file=sys.stderr)  # the schema changed: say so, and where the backup is
    return ledger


def _session_payload(result) -> dict:
    last = result.records[-1] if result.records else None
    return {
        "run": result.run.name,
        "generations_committed": [r.index for r in result.records],
        "latest_generation": result.latest_generation,
        "fingerprint": result.fingerprint,
        "reward_mean": last.reward_stats()["mean"] if last else None,
    }


def _session(ledger: str, as_json: bool, body, create: bool = False) -> None:
    """Run a training session `body(ledger, hooks)` with live progress (none under --json),
    then print its summary and emit the result."""
    from engine.progress import TrainingProgress

    with open_ledger(ledger, create=create) as led, TrainingProgress(enabled=not as_json) as progress:
        result = body(led, progress.hooks())
    if not as_json and progress.rows:
        progress.console.print(progress.summary())
    emit(_session_payload(result), as_json, f"run {result.run.name}: fingerprint {result.fingerprint}")


@app.command()
def train(
    config: Annotated[str | None, typer.Argument(help="YAML config (omit for defaults).")] = None,
    run: Annotated[str | None, typer.Option("--run", help="Run name (default: config file stem).")] = None,
    generations: Gens = None,
    set_: Sets = None,
    ledger: LedgerOpt = DEFAULT_LEDGER,
    as_json: JsonOpt = False,
):
    """Start a new run from CONFIG and train it."""
    from engine import session

    _session(
        ledger, as_json, lambda led, hooks: session.start(led, config, run, set_ or [], generations, hooks),
        create=True,
    )


@app.command()
def resume(
    run: Annotated[str, typer.Argument(help="Run to continue from its last committed generation.")],
    generations: Gens = None,
    ledger: LedgerOpt = DEFAULT_LEDGER,
    as_json: JsonOpt = False,
):
    """Continue RUN from its last committed generation."""
    from engine import session

    _session(ledger, as_json, lambda led, hooks: session.resume(led, run, generations, hooks))


@app.command()
def fork(
    ref: Annotated[str, typer.Argument(help="RUN@G to fork from.")],
    run: Annotated[str, typer.Option("--run", help="Name of the new run.")],
    set_: Sets = None,
    generations: Gens = None,
    ledger: LedgerOpt = DEFAULT_LEDGER,
    as_json: JsonOpt = False,
):
    """Start a child run at RUN@G (optionally with changed settings) and train it."""
    from engine import session

    _session(ledger, as_json, lambda led, hooks: session.fork(led, ref, run, set_ or [], generations, hooks))


@app.command()
def verify(
    ref: Annotated[str, typer.Argument(help="RUN or RUN@G.")],
    device: Annotated[str, typer.Option("--device", help="cpu or cuda.")] = "cpu",
    ledger: LedgerOpt = DEFAULT_LEDGER,
    as_json: JsonOpt = False,
):
    """Replay RUN up to G from its base and check every fingerprint (exit 1 on a mismatch)."""
    from engine import rebuilding
    from ledger.errors import NotVerified, VerifyMismatch

    with open_ledger(ledger) as led:
        report = rebuilding.verify_ref(led, ref, device)
    if not report["ok"]:
        emit(report, as_json)  # the JSON report says which generation; stderr the one line
        raise (NotVerified if "not_verified" in report else VerifyMismatch)(report["error"])
    emit(report, as_json, f"verified {report['run']}@{report['generation']}: "
         f"{report['generations_checked']} fingerprints match ({report['fingerprint']})")


class VerifyWhen(StrEnum):
    every = "every"
    end = "end"


VerifyOpt = Annotated[
    VerifyWhen,
    typer.Option("--verify", help="Check the fingerprint of every replayed generation, or only the last."),
]
AllowUnverified = Annotated[
    bool,
    typer.Option(
        "--allow-unverified",
        help="Accept a history with no fingerprint to check it against (base or generation).",
    ),
]


@app.command()
def rebuild(
    source: Annotated[str, typer.Argument(help="RUN, RUN@G in the ledger, or a FILE.seeds.")],
    output: Annotated[Path, typer.Option("-o", "--output", help="Directory to write.")],
    base: Annotated[str | None, typer.Option("--base", help="Base model alias or directory.")] = None,
    device: Annotated[str, typer.Option("--device", help="cpu or cuda.")] = "cpu",
    verify_: VerifyOpt = VerifyWhen.end,
    force: Annotated[
        bool, typer.Option("--force", help="Replace DIR even if it is not an earlier rebuild's output.")
    ] = False,
    allow_unverified: AllowUnverified = False,
    ledger: LedgerOpt = DEFAULT_LEDGER,
    as_json: JsonOpt = False,
):
    """Rebuild the model at RUN@G (or from a seed file) as a Hugging Face directory.

    SOURCE is a run when it names one in the ledger (RUN or RUN@G), else a seed file;
    write ./NAME for a file that shares its name with a run.
    """
    from engine import rebuilding

    report = rebuilding.rebuild_source(
        ledger or DEFAULT_LEDGER, source, output, base, device,
        verify=verify_.value, force=force, upgrade=State.upgrade, allow_unverified=allow_unverified,
    )
    unverified = f"; NOT VERIFIED: {report['not_verified']}" if not report["verified"] else ""
    emit(report, as_json, f"wrote {report['output']} ({report['run']}@{report['generation']}, "
         f"fingerprint {report['fingerprint']}{unverified})")


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
    ledger: LedgerOpt = DEFAULT_LEDGER,
    as_json: JsonOpt = False,
):
    """Import a seed file into the ledger as a run (refused when it lacks fingerprints,
    unless --allow-unverified)."""
    from ledger.seedio import import_seedfile
    from replay.noise import member_key

    with open_ledger(ledger, create=True) as led:
        info = import_seedfile(led, file, run, key_fn=member_key, allow_unverified=allow_unverified)
        latest = led.latest_generation(info.name)
        why = led.events(info.name, "import")[-1].payload.get("not_verified")
    payload = {"run": info.name, "latest_generation": latest, "verified": why is None}
    if why is not None:
        payload["not_verified"] = why
    note = f" (NOT VERIFIED: {why})" if why is not None else ""
    emit(payload, as_json, f"imported {info.name}@{latest}{note}")


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


# --- audit: log / show / diff (engine.audit computes, engine.audit_render draws) ---------


@app.command()
def log(
    run: Annotated[str | None, typer.Argument(help="Run whose generations to list (omit: all runs).")] = None,
    graph: Annotated[bool, typer.Option("--graph", help="Draw the fork tree.")] = False,
    ledger: LedgerOpt = DEFAULT_LEDGER,
    as_json: JsonOpt = False,
):
    """List runs, one run's generations, or (--graph) the fork tree."""
    from engine import audit
    from engine import audit_render as ar

    with open_ledger(ledger) as led:
        if graph:
            payload, view = audit.fork_graph(led), ar.graph_view
        elif run:
            payload, view = audit.run_log(led, run), ar.run_log_view
        else:
            payload, view = audit.list_runs(led), ar.runs_table
    if as_json:
        emit(payload, as_json)
    else:
        ar.print_view(view(payload))


@app.command()
def show(
    ref: Annotated[str, typer.Argument(help="RUN@G (RUN alone: its latest).")],
    member: Annotated[int | None, typer.Argument(help="Member whose outputs --samples prints (default all).")] = None,
    samples: Annotated[bool, typer.Option("--samples", help="Print stored outputs: --samples [MEMBER].")] = False,
    ledger: LedgerOpt = DEFAULT_LEDGER,
    as_json: JsonOpt = False,
):
    """Everything RUN@G committed: hyperparameters, batch, members, coefficients, fingerprint."""
    from engine import audit
    from engine import audit_render as ar

    which = member if member is not None else ("all" if samples else None)
    with open_ledger(ledger) as led:
        payload = audit.show_generation(led, ref, which)
    if as_json:
        emit(payload, as_json)
    else:
        ar.print_view(ar.show_view(payload))


@app.command()
def diff(
    ref_a: Annotated[str, typer.Argument(help="RUN@A.")],
    ref_b: Annotated[str, typer.Argument(help="RUN@B (any run of the same base).")],
    top: Annotated[int | None, typer.Option("--top", help="Show only the N largest tensors.")] = None,
    device: Annotated[str, typer.Option("--device", help="cpu or cuda.")] = "cpu",
    ledger: LedgerOpt = DEFAULT_LEDGER,
    as_json: JsonOpt = False,
):
    """Per-tensor L2 and max |Δ| between two models, rebuilt by replay, largest first."""
    from engine import audit
    from engine import audit_render as ar

    with open_ledger(ledger) as led:
        payload = audit.diff(led, ref_a, ref_b, device)
    if as_json:
        emit(payload, as_json)
    else:
        ar.print_view(ar.diff_view(payload, top))


@app.command()
def plot(
    run: Annotated[str, typer.Argument(help="Run whose reward curve to draw.")],
    output: Annotated[Path, typer.Option("-o", "--output", help="PNG file to write.")],
    ledger: LedgerOpt = DEFAULT_LEDGER,
    as_json: JsonOpt = False,
):
    """Draw RUN's reward curve (from the ledger alone) to a PNG."""
    from engine.plot import plot_run

    with open_ledger(ledger) as led:
        led.get_run(run)
        payload = plot_run(led, run, output)
    emit(payload, as_json, f"wrote {output}")


@app.command()
def demo(
    workdir: Annotated[Path, typer.Option("--workdir", help="Where the demo writes.")] = Path("demo-out"),
    generations: Gens = None,
    as_json: JsonOpt = False,
):
    """The end-to-end demo: train SmolLM2 on arithmetic, rebuild, verify, export, report."""
    import contextlib

    from engine.demo import run_demo

    if not as_json:
        run_demo(workdir, generations)
        return
    with contextlib.redirect_stdout(sys.stderr):  # the demo's table; stdout is the JSON alone
        figures = run_demo(workdir, generations)
    emit(figures, as_json)


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
    typer.echo(f"error: {message} (see `{where} --help`)", err=True)
    sys.exit(2)


def main() -> None:
    """Console-script entry point: map errors to one line and an exit code."""
    from engine.models import quiet_hf_env

    quiet_hf_env()  # no hub, no library progress bars: an error must stay one line
    try:
        app(standalone_mode=False)
    except SeedLedgerError as exc:
        if State.debug:
            traceback.print_exc()
        typer.echo(f"error: {' '.join(str(exc).split())}", err=True)
        sys.exit(exc.exit_code)
    except UsageError as exc:
        _usage_error(exc)
    except (typer.Abort, KeyboardInterrupt):
        typer.echo("aborted", err=True)
        sys.exit(130)
    except typer.Exit as exc:
        sys.exit(exc.exit_code)
    except ClickException as exc:  # e.g. a file option that cannot be opened
        if State.debug:
            raise
        typer.echo(f"error: {' '.join(exc.format_message().split())}", err=True)
        sys.exit(2)
    except Exception as exc:
        if State.debug:
            raise
        typer.echo(f"error: {type(exc).__name__}: {exc} (run with --debug for a traceback)", err=True)
        sys.exit(1)


if __name__ == "__main__":
    main()
