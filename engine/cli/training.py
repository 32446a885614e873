"""Commands that train: `train`, `resume`, `fork`, and `demo` (train, rebuild, verify,
export, report). The work is engine.api (engine.runtime.session) and engine.cli.demo, imported when a
command runs, so that starting the CLI stays light.
"""

from __future__ import annotations

import os
import shlex
import sys
from pathlib import Path
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

Sets = Annotated[
    list[str] | None,
    typer.Option("--set", help="Override a config key: key=value (dots for nesting); one --set per key."),
]
Gens = Annotated[int | None, typer.Option("--generations", "-n", help="Generations to train.")]
AcceptInputs = Annotated[
    bool,
    typer.Option("--accept-changed-inputs", help="Train although data, reward code, scoring libraries or "
                 "tokenizer differ from the session before (recorded in the ledger with both hashes)."),
]
TrustCode = Annotated[
    bool,
    typer.Option("--trust-code", help="Import the reward code the run's stored config names (read it first)."),
]


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
    then print its summary and emit the result. SIGTERM stops it as Ctrl-C does
    (engine.runtime.console.interrupts); the one line then names the `resume` command to run."""
    import contextlib

    from seedledger.engine.api import removed_if_unused
    from seedledger.engine.runtime import RunInterrupted, TrainingProgress, sigterm_raises

    # under --json, stdout is the JSON document alone: log lines (provisioning) go to stderr
    quiet = contextlib.redirect_stdout(sys.stderr) if as_json else contextlib.nullcontext()
    # a ledger this command creates is removed again if it fails before a run exists
    fresh = removed_if_unused(ledger or DEFAULT_LEDGER) if create else contextlib.nullcontext()
    with sigterm_raises(), quiet, fresh, open_ledger(ledger, create=create) as led, \
            TrainingProgress(enabled=not as_json) as progress:
        try:
            result = body(led, progress.hooks())
        except RunInterrupted as exc:
            if exc.run is not None:
                exc.args = (f"{exc}; continue with `{_resume_command(led, exc.run, ledger)}`",)
            raise
        resume = None if result.records else _resume_command(led, result.run.name, ledger)
    if not as_json and progress.rows:
        progress.console.print(progress.summary())
    emit(_session_payload(result), as_json, _summary_line(result, resume))


def _summary_line(result, resume: str | None) -> str:
    """The session's last line; a session that trained nothing (generations 0) says so,
    and how to train (`resume`: the command that continues the run)."""
    if result.records:
        return f"run {result.run.name}: fingerprint {result.fingerprint}"
    return (f"run {result.run.name}: nothing trained (0 generations asked): it stays at generation "
            f"{result.latest_generation}, fingerprint {result.fingerprint}; `{resume} --generations N` trains N")


def _resume_command(led, run: str, ledger: str) -> str:
    """The `resume` that continues `run` as it stands: `--trust-code` where its stored
    config names code (a module run's factory, reward code), `--ledger` unless implied."""
    from seedledger.engine.api import stored_code
    from seedledger.ledger.db import display_location

    implied = ("", DEFAULT_LEDGER, os.environ.get("SEEDLEDGER_DB"))  # what `resume` finds alone
    where = "" if ledger in implied else f" --ledger {shlex.quote(display_location(ledger))}"
    try:
        trust = " --trust-code" if stored_code(led.get_run(run).config) else ""
    except Exception:  # the hint must not hide the interrupt
        trust = ""
    return f"seedledger resume {run}{trust}{where}"


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
    from seedledger.engine import api

    _session(ledger, as_json, lambda led, hooks: api.train(
        config, run=run, overrides=set_ or [], generations=generations, ledger=led, hooks=hooks), create=True)


@app.command()
def resume(
    run: Annotated[str, typer.Argument(help="Run to continue from its last committed generation.")],
    generations: Gens = None,
    take_over: Annotated[
        bool,
        typer.Option("--take-over", help="Take the run's writer lease from a session on another "
                     "host that is gone (its next commit would fail if it is not)."),
    ] = False,
    trust_code: TrustCode = False,
    accept_changed_inputs: AcceptInputs = False,
    ledger: LedgerOpt = DEFAULT_LEDGER,
    as_json: JsonOpt = False,
):
    """Continue RUN from its last committed generation.

    By default towards its config's `generations` (a run already there is an error);
    --generations N trains N more, past it if need be."""
    from seedledger.engine import api
    from seedledger.ledger.errors import SeedLedgerError

    def body(led, hooks):
        result = api.resume(run, generations=generations, ledger=led, hooks=hooks, take_over=take_over,
                            trust_code=trust_code, accept_changed_inputs=accept_changed_inputs)
        if generations is None and not result.records:  # at its target: say so, not exit 0 silently
            raise SeedLedgerError(
                f"run {run} is at its target generation {result.latest_generation} "
                f"({led.get_run(run).status}): nothing to resume; `seedledger resume {run} "
                "--generations N` trains N more"
            )
        return result

    _session(ledger, as_json, body)


@app.command()
def fork(
    ref: Annotated[str, typer.Argument(help="RUN@G to fork from.")],
    run: Annotated[str, typer.Option("--run", help="Name of the new run.")],
    set_: Sets = None,
    generations: Gens = None,
    trust_code: TrustCode = False,
    accept_changed_inputs: AcceptInputs = False,
    ledger: LedgerOpt = DEFAULT_LEDGER,
    as_json: JsonOpt = False,
):
    """Start a child run at RUN@G (optionally with changed settings) and train it."""
    from seedledger.engine import api

    _session(ledger, as_json, lambda led, hooks: api.fork(
        ref, run, overrides=set_ or [], generations=generations, ledger=led, hooks=hooks, trust_code=trust_code,
        accept_changed_inputs=accept_changed_inputs))


@app.command()
def demo(
    name: Annotated[str, typer.Argument(
        help="Which demo: `likelihood` (the answer format from the reference's likelihood) or "
        "`reward` (an experiment: the word alone from a decoded reward only; it does not learn yet, "
        "docs/choosing.md).")] = "likelihood",
    workdir: Annotated[Path | None, typer.Option(
        "--workdir", help="Where the demo writes (default: demo-out, or demo-reward-out for `reward`).")] = None,
    generations: Gens = None,
    set_: Sets = None,
    as_json: JsonOpt = False,
    config: Annotated[Path | None, typer.Option(
        "--config", help="Another demo config (e.g. configs/arithmetic.yaml, the arithmetic benchmark)."
    )] = None,
):
    """The end-to-end demo: teach SmolLM2 an answer format, rebuild, verify, export, report."""
    import contextlib

    from seedledger.engine.cli.demo import DEMOS, run_demo
    from seedledger.ledger.errors import SeedLedgerError, did_you_mean

    if name not in DEMOS:
        raise SeedLedgerError(f"no demo {name!r}{did_you_mean(name, DEMOS)}; known: {', '.join(DEMOS)}")
    config, workdir = config or DEMOS[name][0], workdir or DEMOS[name][1]
    if not as_json:
        run_demo(workdir, generations, config=config, overrides=set_ or [])
        return
    with contextlib.redirect_stdout(sys.stderr):  # the demo's table; stdout is the JSON alone
        figures = run_demo(workdir, generations, config=config, overrides=set_ or [])
    emit(figures, as_json)
