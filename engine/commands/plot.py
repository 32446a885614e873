"""The reward curve of a run, drawn from the ledger alone (its lineage included)."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.ticker import MaxNLocator  # noqa: E402

from ledger import Ledger  # noqa: E402


def plot_run(ledger: Ledger, run: str, output: Path) -> dict:
    latest = ledger.latest_generation(run)
    gens, means, maxes, mins = [], [], [], []
    for g in range(1, latest + 1):
        stats = ledger.generation(run, g).reward_stats()
        if stats["mean"] is None:
            continue
        gens.append(g)
        means.append(stats["mean"])
        maxes.append(stats["max"])
        mins.append(stats["min"])
    fig, ax = plt.subplots(figsize=(7, 4), dpi=120)
    ax.fill_between(gens, mins, maxes, alpha=0.2, label="population min–max")
    ax.plot(gens, means, marker="o", markersize=3, label="population mean")
    ax.set_xlabel("generation")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_ylabel("train-batch reward")
    ax.set_title(f"seedledger run {run}")
    ax.grid(alpha=0.3)
    ax.legend(loc="best")
    fig.tight_layout()
    output.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(output)
    plt.close(fig)
    return {"run": run, "file": str(output), "generations": len(gens)}
