"""Commands that read the history: `log`, `show`, `diff` (engine.cli.audit computes,
engine.cli.audit_render draws) and `plot` (engine.cli.plot). The work is
imported when a command runs.
"""

from __future__ import annotations

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


@app.command()
def log(
    run: Annotated[
        str | None, typer.Argument(help="RUN (or RUN@G: up to G) whose generations to list; omit: all runs.")
    ] = None,
    graph: Annotated[bool, typer.Option("--graph", help="Draw the fork tree.")] = False,
    ledger: LedgerOpt = DEFAULT_LEDGER,
    as_json: JsonOpt = False,
):
    """List runs, one run's generations, or (--graph) the fork tree."""
    from seedledger.engine.cli import audit
    from seedledger.engine.cli import audit_render as ar

    with open_ledger(ledger) as led:
        if graph:
            payload, view = audit.fork_graph(led), ar.graph_view
        elif run:  # the table escapes and lays out only the lines it shows (ar.log_shown)
            payload, view = audit.run_log(led, run, strict=as_json), ar.run_log_view
        else:
            payload, view = audit.list_runs(led), ar.runs_table
    if as_json:
        emit(payload, as_json)
    else:
        ar.print_view(view(payload if view is ar.run_log_view else ar.safe(payload)))


@app.command()
def show(
    ref: Annotated[str, typer.Argument(help="RUN@G (RUN alone: its latest), or RUN@G#M: one member.")],
    member: Annotated[int | None, typer.Argument(help="Member whose outputs --samples prints (default all).")] = None,
    samples: Annotated[bool, typer.Option("--samples", help="Print stored outputs: --samples [MEMBER].")] = False,
    ledger: LedgerOpt = DEFAULT_LEDGER,
    as_json: JsonOpt = False,
):
    """Everything RUN@G committed: hyperparameters, batch, members, coefficients, fingerprint.
    RUN@G#M shows member M: its row, its weights (RUN@G-1 plus its perturbation), what a GA
    or CMA-ES recorded about it, and with --samples its stored outputs."""
    from seedledger.engine.cli import audit
    from seedledger.engine.cli import audit_render as ar
    from seedledger.engine.refs import split_member
    from seedledger.ledger.errors import SeedLedgerError

    named = split_member(ref)[1]
    if named is not None and member is not None:
        raise SeedLedgerError(f"{ref!r} names member {named} already: drop the MEMBER argument {member}")
    which = member if member is not None else ("all" if samples else None)
    with open_ledger(ledger) as led:
        payload = audit.show_generation(led, ref, which) if named is None else audit.show_member(led, ref, samples)
    if as_json:
        emit(payload, as_json)
    else:
        ar.print_view((ar.show_view if named is None else ar.member_view)(ar.safe(payload)))


@app.command()
def diff(
    ref_a: Annotated[str, typer.Argument(help="RUN@A, or RUN@A#M: a member.")],
    ref_b: Annotated[str, typer.Argument(help="RUN@B or RUN@B#M (any run of the same base).")],
    top: Annotated[int | None, typer.Option("--top", help="Show only the N largest tensors.")] = None,
    device: Annotated[str, typer.Option("--device", help="cpu or cuda.")] = "cpu",
    ledger: LedgerOpt = DEFAULT_LEDGER,
    as_json: JsonOpt = False,
):
    """Per-tensor L2 and max |Δ| between two models, rebuilt by replay, largest first. A
    member RUN@G#M is rebuilt as `rebuild` does: RUN@G-1 (checked) plus its perturbation."""
    from seedledger.engine.api import check_device
    from seedledger.engine.cli import audit
    from seedledger.engine.cli import audit_render as ar

    check_device(device)
    with open_ledger(ledger) as led:
        payload = audit.diff(led, ref_a, ref_b, device)
    if as_json:
        emit(payload, as_json)
    else:
        ar.print_view(ar.diff_view(ar.safe(payload), top))


@app.command()
def plot(
    runs: Annotated[list[str], typer.Argument(help="Runs whose reward curves to draw on one axis.")],
    output: Annotated[Path, typer.Option("-o", "--output", help="PNG file to write.")],
    forks: Annotated[bool, typer.Option("--forks", help="Add every run forked from them.")] = False,
    ledger: LedgerOpt = DEFAULT_LEDGER,
    as_json: JsonOpt = False,
):
    """Draw reward curves (from the ledger alone) to a PNG: forks marked where they fork,
    held-out rewards where recorded (in a panel of their own, on their own scale)."""
    from seedledger.engine.cli.plot import plot_runs, with_forks

    with open_ledger(ledger) as led:
        for run in runs:
            led.get_run(run)
        payload = plot_runs(led, with_forks(led, runs) if forks else runs, output)
    skipped = f" ({', '.join(payload['skipped'])}: no generations, not drawn)" if payload["skipped"] else ""
    emit(payload, as_json, f"wrote {output}: {', '.join(r['run'] for r in payload['runs'])}{skipped}")
