"""`seedledger evaluate`: a run's held-out reward against its base or another run, on the
same rows (the work is engine.runtime.scoring.heldout, through engine.api, imported when it runs)."""

from __future__ import annotations

from typing import Annotated, Any

import typer

from seedledger.engine.cli.app import (
    DEFAULT_LEDGER,
    JsonOpt,
    LedgerOpt,
    app,
    emit,
    open_ledger,
    say,
)
from seedledger.engine.cli.training import TrustCode


@app.command()
def evaluate(
    ref: Annotated[str, typer.Argument(help="RUN@G to score (RUN alone: its latest generation).")],
    rows: Annotated[int | None, typer.Option(
        "--rows", help="Held-out test rows to score (default: the config's evaluation.rows, "
        "else the task's test rows up to 64).")] = None,
    skip: Annotated[int, typer.Option("--skip", help="Start after the first K test rows.")] = 0,
    against: Annotated[str, typer.Option(
        "--against", help="What to compare with on the same rows: `base` (generation 0 of RUN's "
        "lineage) or RUN@G of the same model and task.")] = "base",
    trust_code: TrustCode = False,
    ledger: LedgerOpt = DEFAULT_LEDGER,
    as_json: JsonOpt = False,
):
    """Score RUN@G on the task's held-out test rows, greedily, against the base or another
    run on the same rows (a torch.nn.Module run: its task's held-out seeds).

    Prints both mean rewards, the paired change with its standard error and how many rows
    got better or worse, per-component means, and a few rows whose answers changed. The
    figures are recorded as an `evaluation` event of RUN (`log`, `show` and `plot` show
    them). Rebuilds both models from the ledger; progress goes to stderr."""
    from seedledger.engine import api

    with open_ledger(ledger) as led:
        result = api.evaluate(ref, rows=rows, skip=skip, against=against, ledger=led,
                              trust_code=trust_code, progress=True)
    if result.event_error is not None:  # the result stands; only the audit trail missed it
        say(f"warning: the evaluation event was not recorded: {result.event_error}")
    payload = result.to_dict()
    emit(payload, as_json, render(payload))


def render(r: dict[str, Any]) -> str:
    """The human report of one evaluation."""
    me, them = f"{r['run']}@{r['generation']}", r["against"]
    width = max(len(me), len(them), 10)
    last = r["skip"] + r["rows"] - 1
    how = ", greedy decoding" if r["greedy"] else ""
    lines = [f"held-out {r['unit']} {r['skip']}..{last} ({r['rows']}{how})",
             f"{'':<24}{me:>{width}}  {them:>{width}}",
             f"{'mean reward':<24}{r['mean']:>{width}.4f}  {r['against_mean']:>{width}.4f}"]
    for name in dict.fromkeys([*r["components"], *r["against_components"]]):
        mine, theirs = r["components"].get(name), r["against_components"].get(name)
        lines.append(f"{'  ' + name:<24}{_num(mine):>{width}}  {_num(theirs):>{width}}")
    c = r["change"]
    same = r["rows"] - c["better"] - c["worse"]
    lines.append(f"change on the same rows: {c['mean']:+.4f} ± {c['stderr']:.4f} (s.e.); "
                 f"{c['better']} better, {c['worse']} worse, {same} unchanged or unscored")
    for s in r["samples"]:
        lines += [f"row {s['row']}: {s['question']!r}",
                  f"  {them} ({_num(s['against_reward'])}): {s['against_completion']!r}",
                  f"  {me} ({_num(s['reward'])}): {s['completion']!r}"]
    return "\n".join(lines)


def _num(x: float | None) -> str:
    return "–" if x is None else f"{x:.4f}"
