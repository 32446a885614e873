"""Reward curves drawn from the ledger alone: one run or several on one axis.

Each run is drawn along its lineage: its own generations solid, generations it inherits
from a parent that is not drawn itself dashed, and its fork point marked. Held-out
rewards, where the ledger records them (`evaluation` events: `evaluate`, `evaluation.every`
during training, the demo), are drawn as stars in a second panel below, on a scale of their
own (a training batch's log-likelihood and held-out exact match do not share one). A run
without generations has no curve: it is skipped and named, and a plot with nothing to draw
is an error, not an empty chart.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.ticker import MaxNLocator  # noqa: E402

from seedledger.ledger import Ledger, RunInfo  # noqa: E402
from seedledger.ledger.errors import SeedLedgerError  # noqa: E402


def with_forks(ledger: Ledger, runs: list[str]) -> list[str]:
    """`runs` and every run forked from them, depth first, each once."""
    out: list[str] = []

    def add(name: str) -> None:
        if name not in out:
            out.append(name)
            for child, _ in ledger.children(name):
                add(child)

    for name in runs:
        add(name)
    return out


def _curve(ledger: Ledger, run: str) -> list[tuple[int, str, float, float, float]]:
    """(generation, run that committed it, mean, min, max) along the lineage."""
    segments = ledger.ancestors(run)
    points = []
    for record in ledger.records(run):
        stats = record.reward_stats()
        if stats["mean"] is None or math.isnan(stats["mean"]):  # unknown (imported) rewards
            continue
        holder = next(r for r, a, b in segments if a <= record.index <= b)
        points.append((record.index, holder, stats["mean"], stats["min"], stats["max"]))
    return points


def held_out(ledger: Ledger, run: str) -> list[tuple[int, float]]:
    """(generation, held-out reward) from the run's `evaluation` events (engine.runtime.scoring.heldout;
    ledgers from before it hold `held_out_reward`), each with its comparison when that is
    a generation of the same run (the base: `RUN@0`), once per point."""
    out = set()
    for event in ledger.events(run, "evaluation", imported=True):  # an imported history's too
        p = event.payload
        points = [(p.get("generation"), p.get("mean", p.get("held_out_reward")))]
        against = p.get("against")
        if isinstance(against, str) and against.rpartition("@")[0] == run:
            g = against.rpartition("@")[2]
            points.append((int(g) if g.isdigit() else None, p.get("against_mean")))
        out |= {(g, float(r)) for g, r in points if isinstance(g, int) and isinstance(r, int | float)}
    return sorted(out)


def plot_runs(ledger: Ledger, runs: list[str], output: Path) -> dict[str, Any]:
    infos: list[RunInfo] = [ledger.get_run(r) for r in dict.fromkeys(runs)]
    drawn = {i.name for i in infos}
    curves = {i.name: _curve(ledger, i.name) for i in infos}
    empty = [name for name, points in curves.items() if not points]
    if len(empty) == len(curves):
        raise SeedLedgerError(
            f"nothing to plot: {', '.join(empty)} {'has' if len(empty) == 1 else 'have'} no "
            "generations with rewards (train first: `seedledger resume RUN --generations N`)"
        )
    single = len(infos) == 1
    held = {i.name: held_out(ledger, i.name) for i in infos}
    if any(held.values()):  # two scales (a batch's reward, e.g. a log-likelihood, and held-out exact match)
        fig, (ax, ax_held) = plt.subplots(2, 1, sharex=True, figsize=(8, 6.5), dpi=120, height_ratios=[3, 2])
    else:
        fig, ax = plt.subplots(figsize=(8, 4.5), dpi=120)
        ax_held = None
    report = []
    for index, info in enumerate(infos):
        points = curves[info.name]
        if not points:
            continue
        color = f"C{index % 10}"
        own = [p for p in points if p[1] == info.name or p[1] not in drawn]
        mine = [p for p in own if p[1] == info.name]
        inherited = [p for p in own if p[1] != info.name]
        if inherited:  # from ancestors not drawn themselves: dashed, up to the fork point
            ax.plot([p[0] for p in inherited], [p[2] for p in inherited],
                    color=color, linestyle="--", linewidth=1, alpha=0.7)
        if mine:
            if single:
                ax.fill_between([p[0] for p in mine], [p[3] for p in mine], [p[4] for p in mine],
                                color=color, alpha=0.2, label="population min–max")
            xs, ys = [p[0] for p in mine], [p[2] for p in mine]
            if info.parent is not None:  # join the curve to the model it forked from
                fork_y = next((p[2] for p in points if p[0] == info.parent_generation), None)
                if fork_y is not None:
                    xs, ys = [info.parent_generation, *xs], [fork_y, *ys]
            ax.plot(xs, ys, marker="o", markersize=3, color=color,
                    label="population mean" if single else info.name)
        if info.parent is not None:
            g = info.parent_generation
            for axis in (ax, ax_held) if ax_held is not None else (ax,):
                axis.axvline(g, color=color, linestyle=":", linewidth=1, alpha=0.8)
            ax.annotate(f"{info.name} forks {info.parent_run}@{g}", xy=(g, 1), xycoords=("data", "axes fraction"),
                        xytext=(3, -12 - 10 * index), textcoords="offset points", fontsize=7, color=color)
        evaluated = held[info.name]
        if evaluated:
            ax_held.plot([g for g, _ in evaluated], [r for _, r in evaluated], linestyle=":", marker="*",
                         markersize=11, color=color, markeredgecolor="black",
                         label="held-out reward" if single else f"{info.name} held-out")
        report.append({
            "run": info.name,
            "generations": len(mine),
            "forked_at": f"{info.parent_run}@{info.parent_generation}" if info.parent else None,
            "held_out": [{"generation": g, "reward": r} for g, r in evaluated],
        })
    axes = [ax] if ax_held is None else [ax, ax_held]
    ax.set_ylabel("reward (train batch)")
    if ax_held is not None:
        ax_held.set_ylabel("held-out reward (greedy)")
    axes[-1].set_xlabel("generation")
    axes[-1].xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_title(f"seedledger run {infos[0].name}" if single else "seedledger runs " + ", ".join(drawn_names(report)))
    for axis in axes:
        axis.grid(alpha=0.3)
        axis.legend(loc="best", fontsize=8)
    fig.tight_layout()
    output.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(output)
    plt.close(fig)
    return {"file": str(output), "runs": report, "skipped": empty, "axes": [a.get_ylabel() for a in axes]}


def drawn_names(report: list[dict[str, Any]], limit: int = 4) -> list[str]:
    names = [r["run"] for r in report]
    return names if len(names) <= limit else [*names[:limit], f"+{len(names) - limit}"]


def plot_run(ledger: Ledger, run: str, output: Path) -> dict[str, Any]:
    """One run's curve (the demo's)."""
    return plot_runs(ledger, [run], output)
