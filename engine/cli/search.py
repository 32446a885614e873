"""Commands that search hyperparameters over ordinary runs: `tune` (an Optuna study in the
ledger's database, engine.search.tune) and `pbt` (population-based training on forks, engine.search.pbt).
The work is imported when a command runs.
"""

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
)
from seedledger.engine.cli.training import Sets, TrustCode


def _fmt(value: Any) -> str:
    return "–" if value is None else f"{value:.4f}"


@app.command()
def tune(
    study_file: Annotated[str, typer.Argument(help="Study YAML: config, space, objective, sampler, pruner.")],
    trials: Annotated[int | None, typer.Option("--trials", min=1, help="The study's total trials.")] = None,
    study: Annotated[str | None, typer.Option("--study", help="Study name (default: the file's stem).")] = None,
    set_: Sets = None,
    ledger: LedgerOpt = DEFAULT_LEDGER,
    as_json: JsonOpt = False,
    trust_code: TrustCode = False,
):
    """Run an Optuna study whose trials are runs STUDY-tNNN; rerun to resume it."""
    from seedledger.engine.search.tune import tune as run_tune

    def say(t: dict) -> None:
        if not as_json:
            params = ", ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in t["params"].items())
            typer.echo(f"trial {t['trial']} ({t['run']}): {params} -> {_fmt(t['value'])} {t['state']}"
                       f" @{t['generation']}")

    with open_ledger(ledger, create=True) as led:
        result = run_tune(led, study_file, trials, study, set_ or [], on_trial=say, trust_code=trust_code)
    best = result["best"]
    human = f"study {result['study']}: {len(result['trials'])} trials"
    if best:
        human += f"; best trial {best['trial']} ({best['run']}) held-out {_fmt(best['value'])}"
    emit(result, as_json, human)


@app.command()
def pbt(
    config: Annotated[str, typer.Argument(help="Training config every member starts from.")],
    population: Annotated[int, typer.Option("--population", "-k", help="Members (K).")],
    rounds: Annotated[int, typer.Option("--rounds", "-r", help="Rounds (R).")],
    interval: Annotated[
        int | None, typer.Option("--interval", help="Generations per round (default: generations / rounds).")
    ] = None,
    name: Annotated[
        str | None, typer.Option("--name", help="Runs are NAME-m<slot>[-r<round>] (default: config stem).")
    ] = None,
    fraction: Annotated[
        float, typer.Option("--fraction", help="Share replaced each round (and share they copy).")
    ] = 0.25,
    rows: Annotated[int | None, typer.Option("--rows", help="Held-out rows scored (default: evaluation.rows).")] = None,
    skip: Annotated[int, typer.Option("--skip", help="Held-out rows skipped first.")] = 0,
    set_: Sets = None,
    ledger: LedgerOpt = DEFAULT_LEDGER,
    as_json: JsonOpt = False,
    trust_code: TrustCode = False,
):
    """Population-based training: rounds of training, exploit = fork of the strongest,
    explore = perturbed lr/σ. Rerun to resume; `log --graph` shows the history."""
    from seedledger.engine.search.pbt import PBT

    def say(e: dict) -> None:
        if as_json:
            return
        if e["event"] == "scored":
            typer.echo(f"round {e['round']}: {e['run']} held-out {_fmt(e['score'])}")
        elif e["event"] == "exploit":
            typer.echo(f"round {e['round']}: {e['run']} <- {e['from']} (lr {e['lr']:.3g}, σ {e['sigma']:.3g})")

    with open_ledger(ledger, create=True) as led:
        result = PBT(
            led, config, population, rounds, name=name, interval=interval, fraction=fraction,
            rows=rows, skip=skip, overrides=set_ or [], say=say, trust_code=trust_code,
        ).run()
    best = result["best"]
    emit(result, as_json,
         f"pbt {result['pbt']}: best {best['run']}@{best['generation']} held-out {_fmt(best['score'])}")
