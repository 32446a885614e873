"""`seedledger attribute`: which generations and which training rows made a run's model
answer as it does (the work is engine.rebuild.attribute, through engine.api, imported when
it runs; the drawing reuses `plot`'s matplotlib set-up)."""

from __future__ import annotations

from pathlib import Path
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
def attribute(
    ref: Annotated[str, typer.Argument(help="RUN@G to audit (RUN alone: its latest generation).")],
    rows: Annotated[str | None, typer.Option("--rows", help="Audit the rows of this .jsonl/.parquet file "
                                             "(the task's columns).")] = None,
    held_out: Annotated[int | None, typer.Option("--held-out", help="Audit the task's first N held-out rows "
                                                 "(the default: 8).")] = None,
    skip: Annotated[int, typer.Option("--skip", help="With --held-out: start after the first K rows.")] = 0,
    prompt: Annotated[str | None, typer.Option("--prompt", help="Audit one question, asked as the task asks "
                                               "its rows (with --answer).")] = None,
    answer: Annotated[str | None, typer.Option("--answer", help="The completion whose likelihood --prompt "
                                               "audits, exactly as written.")] = None,
    instead: Annotated[str | None, typer.Option("--instead", help="With --prompt: audit how much the model "
                                                "prefers --answer to this answer.")] = None,
    instead_column: Annotated[str | None, typer.Option("--instead-column", help="With rows: audit how much the "
                                                       "model prefers each row's answer to this column's.")] = None,
    by: Annotated[str, typer.Option("--by", help="likelihood (the reference answer's mean token log-prob) or "
                                    "reward (the task's held-out reward of greedy answers).")] = "likelihood",
    every: Annotated[int, typer.Option("--every", help="Score the model every K generations (and the last).")] = 1,
    generations: Annotated[bool, typer.Option("--generations", help="Rank generations by their exact effect "
                                              "(replayed with each one's coefficients zeroed).")] = False,
    training_rows: Annotated[bool, typer.Option("--training-rows", help="Rank every training row drawn by its "
                                                "replay counterfactual (generations re-weighted without it).")] = False,
    row: Annotated[list[int] | None, typer.Option("--row", help="Re-weight only this training row "
                                                   "(repeatable).")] = None,
    retrain: Annotated[list[int] | None, typer.Option("--retrain", help="Also retrain without this training row "
                                                       "(a fork of the run; repeatable).")] = None,
    into: Annotated[str | None, typer.Option("--into", help="Name of the --retrain fork (default "
                                             "RUN-without-ROW).")] = None,
    top: Annotated[int, typer.Option("--top", help="Rows and generations the report lists (--json: all).")] = 10,
    plot: Annotated[Path | None, typer.Option("--plot", help="Draw the curve (and the generations' effects) "
                                              "to this PNG.")] = None,
    trust_code: TrustCode = False,
    ledger: LedgerOpt = DEFAULT_LEDGER,
    as_json: JsonOpt = False,
):
    """Audit RUN@G on a set of rows: when the model learned what it answers there, which
    generations did it, and which training rows did it.

    One replay pass from the base (every fingerprint checked) scores the model every K
    generations; `--generations` replays each generation's removal exactly and ranks them
    beside the first-order estimate; `--training-rows` re-weights every generation that
    drew a row without it (from the per-row scores the ledger keeps) and ranks the rows;
    `--retrain R` trains a fork without row R to compare. Progress goes to stderr."""
    from seedledger.engine import api

    with open_ledger(ledger) as led:
        result = api.attribute(
            ref, rows=rows, held_out=held_out, skip=skip, prompt=prompt, answer=answer, instead=instead,
            instead_column=instead_column, by=by, every=every,
            generations=generations, training_rows=row or training_rows, retrain=retrain or [], into=into,
            trust_code=trust_code, ledger=led, progress=_progress())
    payload = result.to_dict()
    if plot is not None:
        payload["plot"] = draw(payload, plot)
    emit(payload, as_json, render(payload, top))


def _progress():
    shown: dict[str, int] = {}

    def progress(what: str, done: int, total: int) -> None:
        step = max(total // 10, 1)
        if done == total or done // step != shown.get("at", -1):
            shown["at"] = done // step
            say(f"attribute: {done}/{total} updates replayed")

    return progress


def render(r: dict[str, Any], top: int) -> str:
    """The human report of one audit."""
    p = r["probe"]
    what = f"{p['by']} of the answer less that of {p['instead']}" if "instead" in p else p["by"]
    lines = [f"attribute {r['run']}@{r['generation']}: {what} on {p['rows']}"]
    lines += ["  gen  metric      fingerprint"]
    lines += [f"  {c['generation']:>3}  {c['metric']:>10.6g}  {c['fingerprint'][:12]}" for c in r["curve"]]
    if r["generations"] is not None:
        rho = "n/a" if r["agreement"] is None else f"{r['agreement']:.3f}"
        lines += ["generations by exact effect (replayed without each; first-order: the curve's step), "
                  f"Spearman ρ {rho}", "  gen      effect  first-order"]
        lines += [f"  {e['generation']:>3}  {e['effect']:>+10.4g}  {e['first_order']:>+11.4g}"
                  for e in r["generations"][:top]]
    if r["training_rows"] is not None:
        lines += ["training rows by effect (replay counterfactual: the generations that drew each re-weighted "
                  "without it)", "   row      effect  seen        question → answer"]
        for e in r["training_rows"][:top]:
            seen = ",".join(map(str, e["seen"]))
            lines.append(f"  {e['row']:>4}  {e['effect']:>+10.4g}  {seen[:10]:<10}  {e['question'][:50]!r} → "
                         f"{str(e['answer'])[:30]!r}")
    for e in r["retrain"] or []:
        lines.append(f"retrain without row {e['row']} ({e['run']}, forked at {e['from']}): effect {e['effect']:+.4g}, "
                     f"replay {e['replay_effect']:+.4g}: {'same sign' if e['agree'] else 'signs differ'}")
    if r["sign_agreement"] is not None:
        a = r["sign_agreement"]
        lines.append(f"replay and retrain agree in sign on {a['agree']} of {a['rows']} rows")
    c = r["cost"]
    lines.append(f"{c['seconds']:.1f} s, {c['updates']} updates, {c['scorings']} scorings, "
                 f"peak memory {c['peak_rss_mib']:.0f} MiB")
    if "plot" in r:
        lines.append(f"wrote {r['plot']}")
    return "\n".join(lines)


def draw(r: dict[str, Any], output: Path) -> str:
    """The curve, and below it each generation's exact effect beside its first-order estimate."""
    from seedledger.engine.cli.plot import MaxNLocator, plt  # Agg, as `plot` draws

    gens = r["generations"]
    fig, axes = plt.subplots(2 if gens else 1, 1, figsize=(8, 6 if gens else 4), dpi=120, squeeze=False)
    ax = axes[0][0]
    ax.plot([c["generation"] for c in r["curve"]], [c["metric"] for c in r["curve"]], marker="o", markersize=3)
    ax.set_xlabel("generation")
    ax.set_ylabel(f"{r['probe']['by']} ({r['probe']['rows']})")
    ax.set_title(f"seedledger attribute {r['run']}@{r['generation']}")
    for a in axes[:, 0]:
        a.xaxis.set_major_locator(MaxNLocator(integer=True))
        a.ticklabel_format(axis="y", useOffset=False)
        a.grid(alpha=0.3)
    if gens:
        bx = axes[1][0]
        order = sorted(gens, key=lambda e: e["generation"])
        xs = [e["generation"] for e in order]
        bx.bar([x - 0.2 for x in xs], [e["effect"] for e in order], width=0.4, label="exact (replayed without g)")
        bx.bar([x + 0.2 for x in xs], [e["first_order"] for e in order], width=0.4, label="first-order (curve step)")
        bx.set_xlabel("generation")
        bx.set_ylabel("effect on the metric")
        bx.legend(fontsize=8)
    fig.tight_layout()
    output.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(output)
    plt.close(fig)
    return str(output)
