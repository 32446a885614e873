"""Choose `make demo`'s settings with `seedledger tune`, then check the winner on the demo's rows.

Search: lr, σ, population and batch size, with generations derived so that every trial
stays within the demo's training budget (population × batch × generations ≤ 8 × 16 × 16,
about 8 minutes of training on this 2-core machine, under the 15 allowed). The objective
is the held-out reward on test rows 200..399 of a 400-row test split (`test_size: 400`,
`objective.skip: 200`): the arithmetic split is a prefix-stable stream, so rows 0..199
are exactly the demo's held-out rows, and the search never sees them. (The trials' training
pool therefore excludes 400 test questions instead of 200: a slightly smaller pool.)

Check: the demo config and the winner (with the demo's own task, `test_size` 200) are each
trained once and scored on the demo's 200 rows against the base model and each other,
paired per row with standard errors. If the winner gains more, put its settings in
`configs/arithmetic.yaml` by hand (the script only reports).

    python benchmarks/tune_demo.py [--trials 20] [--workdir tune-demo-out]
    python benchmarks/tune_demo.py --reduced      # 4 trials at a quarter of the budget, 100 rows

With `--reduced` the search is short-horizon (each trial a quarter of the demo's
generations); the check still trains the winner at the demo's full budget.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import yaml

from seedledger.engine.cli.demo import CONFIG
from seedledger.engine.config import load_config, validate
from seedledger.engine.runtime import session
from seedledger.engine.runtime.scoring.heldout import HeldOut, paired_change
from seedledger.engine.search.tune import override, tune
from seedledger.ledger import Ledger

DEMO_BUDGET = 8 * 16 * 16  # population × batch_size × generations of configs/arithmetic.yaml


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--workdir", type=Path, default=Path("tune-demo-out"))
    p.add_argument("--trials", type=int, default=None)
    p.add_argument("--reduced", action="store_true", help="4 trials, budget / 4, 100 search rows")
    args = p.parse_args()
    trials = args.trials or (4 if args.reduced else 20)
    budget = DEMO_BUDGET // 4 if args.reduced else DEMO_BUDGET
    args.workdir.mkdir(parents=True, exist_ok=True)
    demo = yaml.safe_load(CONFIG.read_text())
    search = {**demo, "task": {"name": "arithmetic", "test_size": 400}, "anchor_every": 0}
    (args.workdir / "search.yaml").write_text(yaml.safe_dump(search))
    study = {
        "config": "search.yaml", "study": "demo-search", "trials": trials, "budget": budget,
        "objective": {"rows": 100 if args.reduced else 200, "skip": 200, "every": 4},
        "sampler": {"name": "tpe", "seed": 0, "startup_trials": min(8, trials)},
        "pruner": {"name": "median", "startup_trials": 3, "warmup": 4},
        "space": {
            "lr": {"type": "float", "low": 1e-4, "high": 5e-3, "log": True},
            "sigma": {"type": "float", "low": 3e-4, "high": 5e-3, "log": True},
            "population": {"type": "categorical", "choices": [4, 8, 16]},
            "batch_size": {"type": "categorical", "choices": [8, 16, 32]},
        },
    }
    (args.workdir / "study.yaml").write_text(yaml.safe_dump(study))
    out: dict = {"budget": budget, "trials": trials}
    with Ledger.open(str(args.workdir / "demo-search.db")) as led:
        started = time.perf_counter()
        result = tune(led, args.workdir / "study.yaml", on_trial=lambda t: print(json.dumps(t), flush=True))
        out["search_seconds"] = time.perf_counter() - started
        out["trials_done"] = result["trials"]
        best = result["best"]
        winner = [override(k, v) for k, v in best["params"].items()]
        cfg = load_config(CONFIG, winner)
        # The check is at the demo's own budget, whatever budget the search used.
        winner.append(f"generations={max(1, DEMO_BUDGET // (cfg.population * cfg.batch_size))}")
        for name, sets in (("demo", []), ("winner", winner)):
            if not led.has_run(name):
                started = time.perf_counter()
                session.start(led, str(CONFIG), name, sets, None)
                out[f"{name}_train_seconds"] = time.perf_counter() - started
        rows = HeldOut(validate(led.get_run("demo").config), 200)  # the demo's rows, 0..199
        base = rows.rewards(led, "demo", 0)
        demo_rows = rows.rewards(led, "demo", led.latest_generation("demo"))
        won = rows.rewards(led, "winner", led.latest_generation("winner"))
        out["winner_settings"] = winner
        out["held_out"] = {"base": sum(base) / 200, "demo": sum(demo_rows) / 200, "winner": sum(won) / 200}
        out["demo_minus_base"] = paired_change(base, demo_rows)
        out["winner_minus_base"] = paired_change(base, won)
        out["winner_minus_demo"] = paired_change(demo_rows, won)
    print(json.dumps(out, indent=2, default=str))


if __name__ == "__main__":
    main()
