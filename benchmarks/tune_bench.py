"""SmolLM2: a 6-trial Optuna study (`seedledger tune`) and a 4×3 PBT (`seedledger pbt`), each
against the default config (the demo's: σ = 1e-3, α = 5e-4, rank-1 low-rank members)
trained for the same total number of generations (the same evaluation budget: population
and batch are fixed here).

Rows: the search and PBT score on held-out test rows [report, report + search); the figures
are on rows [0, report), which neither looked at. Prints one JSON document; `--small` runs
everything at a size this 2-core CPU finishes in well under an hour.

    python benchmarks/tune_bench.py [--workdir tune-bench-out] [--small]
"""

from __future__ import annotations

import argparse
import json
import shutil
import time
from pathlib import Path

import yaml

from seedledger.engine.config import validate
from seedledger.engine.runtime import session
from seedledger.engine.runtime.scoring.heldout import HeldOut, paired_change
from seedledger.engine.search.pbt import PBT
from seedledger.engine.search.tune import tune
from seedledger.ledger import Ledger


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--workdir", type=Path, default=Path("tune-bench-out"))
    p.add_argument("--small", action="store_true", help="population 4, batch 4, 12 tokens, 24/48 rows")
    p.add_argument("--trials", type=int, default=6)
    p.add_argument("--generations", type=int, default=None, help="per trial (default 4; --small 3)")
    p.add_argument("--pbt", default="4x3", help="KxR")
    p.add_argument("--model", default="smollm2-135m-instruct", help="tiny: a smoke test of this script")
    args = p.parse_args()
    small = args.small
    gens = args.generations or (3 if small else 4)
    search_rows, report_rows = (24, 48) if small else (64, 100)
    base = {
        "model": args.model, "task": "arithmetic", "population": 4 if small else 8,
        "perturbation": "lowrank",  # the demo's: the population in one batched forward
        "sigma": 1e-3, "lr": 5e-4, "generations": gens, "batch_size": 4 if small else 16,
        "max_new_tokens": 12 if small else 24, "seed": 0, "evaluation": {"rows": report_rows},
    }
    shutil.rmtree(args.workdir, ignore_errors=True)
    args.workdir.mkdir(parents=True)
    (args.workdir / "base.yaml").write_text(yaml.safe_dump(base))
    study = {
        "config": "base.yaml", "study": "bench", "trials": args.trials,
        "objective": {"rows": search_rows, "skip": report_rows, "every": 1},
        "sampler": {"name": "tpe", "seed": 0, "startup_trials": 3},
        "pruner": {"name": "median", "startup_trials": 2, "warmup": 1},
        "space": {
            "lr": {"type": "float", "low": 1e-4, "high": 1e-2, "log": True},
            "sigma": {"type": "float", "low": 3e-4, "high": 1e-2, "log": True},
            "shaping": {"type": "categorical", "choices": ["zscore", "centered_rank"]},
        },
    }
    (args.workdir / "study.yaml").write_text(yaml.safe_dump(study))
    k, r = (int(x) for x in args.pbt.split("x"))
    figures: dict = {"settings": {**base, "trials": args.trials, "pbt": args.pbt,
                                  "search_rows": [report_rows, report_rows + search_rows],
                                  "report_rows": [0, report_rows]}}
    with Ledger.open(str(args.workdir / "bench.db")) as led:
        started = time.perf_counter()
        result = tune(led, args.workdir / "study.yaml")
        figures["tune_seconds"] = time.perf_counter() - started
        tune_budget = sum(led.latest_generation(t["run"]) for t in result["trials"])
        started = time.perf_counter()
        pbt = PBT(led, args.workdir / "base.yaml", k, r, name="pbt", interval=max(1, gens // r),
                  rows=search_rows, skip=report_rows).run()
        figures["pbt_seconds"] = time.perf_counter() - started
        pbt_budget = sum(led.latest_generation(run.name) - run.parent_generation
                         for run in led.list_runs() if run.name.startswith("pbt-"))
        started = time.perf_counter()
        longest = max(tune_budget, pbt_budget)
        session.start(led, str(args.workdir / "base.yaml"), "default", [f"generations={longest}"], None)
        figures["default_seconds"] = time.perf_counter() - started
        cfg = validate(led.get_run("default").config)
        report = HeldOut(cfg, report_rows)
        base_rows = report.rewards(led, "default", 0)
        best = result["best"]
        compared = {
            "tune": (best["run"], led.latest_generation(best["run"]), tune_budget),
            "pbt": (pbt["best"]["run"], pbt["best"]["generation"], pbt_budget),
        }
        figures["base_model"] = sum(base_rows) / len(base_rows)
        for what, (run, g, budget) in compared.items():
            found = report.rewards(led, run, g)
            default = report.rewards(led, "default", budget)
            figures[what] = {
                "best_run": f"{run}@{g}", "budget_generations": budget,
                "best_held_out": sum(found) / len(found),
                "default_held_out": sum(default) / len(default),
                "best_minus_default": paired_change(default, found),
                "best_params": best["params"] if what == "tune" else yaml.safe_load(json.dumps(
                    {k2: led.get_run(run).config[k2] for k2 in ("lr", "sigma")})),
            }
        figures["trials"] = result["trials"]
        figures["pbt_rounds"] = pbt["rounds_done"]
    print(json.dumps(figures, indent=2, default=str))


if __name__ == "__main__":
    main()
