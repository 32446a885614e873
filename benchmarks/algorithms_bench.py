"""ES vs GA vs CMA-ES (vs LM-MA-ES on adapters) on one task, model and evaluation budget.

Each algorithm trains an ordinary run in one ledger with the same population, generations,
batch and seed (so the same number of evaluations); every generation's master is scored on
the same held-out rows (greedy, `engine.runtime.scoring.heldout`). Prints a table (best and final held-out
reward, evaluations, wall time) and writes one plot.

    python benchmarks/algorithms_bench.py                       # tiny: a smoke test
    python benchmarks/algorithms_bench.py --model smollm2-135m-instruct --generations 20 \\
        --population 8 --batch 16 --rows 64 --sigma 0.001 --lr 0.0005 --tokens 24   # the README's
    python benchmarks/algorithms_bench.py --train lora --algorithms es,cmaes,lmmaes ...  # adapters
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import yaml

from seedledger.engine.config import validate
from seedledger.engine.runtime import session
from seedledger.engine.runtime.scoring.heldout import HeldOut
from seedledger.ledger import Ledger

ALGOS = {
    "es": {"algorithm": "es", "mirrored": True},
    "ga": {"algorithm": "ga", "mirrored": False, "lr": 1.0},
    "ga3": {"algorithm": "ga", "mirrored": False, "lr": 1.0, "ga": {"survivors": 3}},  # three lineages
    "cmaes": {"algorithm": "cmaes", "mirrored": True, "lr": 1.0},
    "lmmaes": {"algorithm": "lmmaes", "mirrored": False, "lr": 1.0},  # adapter runs only
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="tiny")
    ap.add_argument("--task", default="arithmetic")
    ap.add_argument("--population", type=int, default=4)
    ap.add_argument("--generations", type=int, default=3)
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--tokens", type=int, default=8)
    ap.add_argument("--sigma", type=float, default=0.01)
    ap.add_argument("--lr", type=float, default=0.005, help="ES's lr (GA and CMA-ES use lr 1: c_m)")
    ap.add_argument("--rows", type=int, default=8, help="held-out test rows")
    ap.add_argument("--plot", default="algorithms_bench.png")
    ap.add_argument("--train", choices=["full", "lora"], default="full", help="every weight, or a LoRA adapter")
    ap.add_argument("--rank", type=int, default=8, help="LoRA rank (--train lora)")
    ap.add_argument("--algorithms", default=None,
                    help="comma-separated, of " + ", ".join(ALGOS) + " (default: es,ga,cmaes; lmmaes too with lora)")
    args = ap.parse_args()
    names = (args.algorithms or "es,ga,cmaes" + (",lmmaes" if args.train == "lora" else "")).split(",")
    unknown = [n for n in names if n not in ALGOS]
    if unknown:
        ap.error(f"unknown algorithm(s): {', '.join(unknown)}")

    base = {
        "model": args.model, "task": args.task, "population": args.population,
        "generations": args.generations, "batch_size": args.batch, "max_new_tokens": args.tokens,
        "sigma": args.sigma, "lr": args.lr, "seed": 0,
    }
    if args.train == "lora":
        base["train"] = {"kind": "lora", "rank": args.rank}
    curves, table = {}, []
    with tempfile.TemporaryDirectory() as tmp:
        with Ledger.open(str(Path(tmp) / "bench.db")) as led:
            heldout = None
            for name in names:
                changes = ALGOS[name]
                path = Path(tmp) / f"{name}.yaml"
                path.write_text(yaml.safe_dump(base | changes))
                started = time.perf_counter()
                session.start(led, str(path), name, [], None)
                wall = time.perf_counter() - started
                if heldout is None:  # from the stored config: an adapter's train block is resolved there
                    heldout = HeldOut(validate(led.get_run(name).config), args.rows)
                curves[name] = [heldout.score(led, name, g) for g in range(args.generations + 1)]
                table.append((name, max(curves[name][1:]), curves[name][-1], args.population * args.generations, wall))
    print(f"model {args.model}, task {args.task}, population {args.population}, generations "
          f"{args.generations}, batch {args.batch}, train {args.train}; held-out rows {args.rows} "
          f"(base {curves[names[0]][0]:.3f})")
    print(f"{'algorithm':<10} {'best held-out':>14} {'final held-out':>15} {'evaluations':>12} {'wall s':>8}")
    for name, best, final, evals, wall in table:
        print(f"{name:<10} {best:>14.3f} {final:>15.3f} {evals:>12} {wall:>8.1f}")

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    for name, ys in curves.items():
        ax.plot(range(len(ys)), ys, marker="o", label=name)
    ax.set_xlabel("generation")
    ax.set_ylabel("held-out reward")
    ax.set_title(f"{args.model} / {args.task} ({args.train}): " + " vs ".join(names))
    ax.legend()
    fig.tight_layout()
    fig.savefig(args.plot)
    print(f"wrote {args.plot}")


if __name__ == "__main__":
    main()
