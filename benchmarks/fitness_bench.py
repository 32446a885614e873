"""Decoded fitness against likelihood fitness (issue 30 items 2 and 3), same rows, same members.

For each fitness (`decode`: greedy answers scored by the task's exact match; `loglik`: the
reference answer's mean log-probability, nothing decoded) and each population size, one
training session of a few generations on the same task, seed and σ. Printed per setting:
seconds per generation, rows scored per second (population × batch / seconds), and the
generations with *no signal*: every member's reward equal, so the update is zero and the
fingerprint does not move. Prints one JSON document.

    python benchmarks/fitness_bench.py [--model smollm2-135m-instruct] [--populations 8 32]
        [--generations 3] [--batch 8] [--sigma 0.001] [--data engine/configs/data/capitals.jsonl]
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import seedledger as sl

HERE = Path(__file__).resolve().parent.parent
SYSTEM = "Answer with the city in <answer></answer> tags."


def config(args: argparse.Namespace, fitness: str, population: int) -> dict:
    rewards = ["loglik"] if fitness == "loglik" else ["task"]
    return {
        "model": args.model,
        "task": {"name": "jsonl", "path": str(Path(args.data).resolve()), "system": args.system,
                 "casefold": True, "test_size": 10, "rewards": rewards},
        "population": population, "perturbation": args.perturbation, "sigma": args.sigma, "lr": args.lr,
        "generations": args.generations, "batch_size": args.batch, "max_new_tokens": args.new_tokens, "seed": 0,
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="smollm2-135m-instruct")
    p.add_argument("--data", default=str(HERE / "engine/configs/data/capitals.jsonl"))
    p.add_argument("--system", default=SYSTEM)
    p.add_argument("--populations", type=int, nargs="+", default=[8, 32])
    p.add_argument("--fitness", nargs="+", default=["decode", "loglik"])
    p.add_argument("--generations", type=int, default=3)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--new-tokens", type=int, default=16)
    p.add_argument("--sigma", type=float, default=0.001)
    p.add_argument("--lr", type=float, default=0.005)
    p.add_argument("--perturbation", default="lowrank")
    args = p.parse_args()
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        db = Path(tmp) / "bench.db"
        for population in args.populations:
            for fitness in args.fitness:
                run = f"{fitness}-n{population}"
                started = time.perf_counter()
                sl.train(config(args, fitness, population), run=run, ledger=db)
                seconds = time.perf_counter() - started
                records = sl.history(run, ledger=db)
                per_gen = sorted(r.timings.get("wall", 0.0) for r in records)
                steady = per_gen[len(per_gen) // 2] or seconds / len(records)  # the median generation
                ties = sum(len({m.reward for m in r.members}) == 1 for r in records)
                results.append({
                    "fitness": fitness, "population": population, "generations": len(records),
                    "seconds_per_generation": round(steady, 2),
                    "rows_per_second": round(population * args.batch / steady, 1),
                    "no_signal_generations": ties,
                    "session_seconds": round(seconds, 1),
                    "reward_first": round(records[0].reward_stats()["mean"], 4),
                    "reward_last": round(records[-1].reward_stats()["mean"], 4),
                })
                print(json.dumps(results[-1]), flush=True)
    by = {(r["fitness"], r["population"]): r for r in results}
    ratios = {
        f"n{n}_loglik_speedup": round(
            by["decode", n]["seconds_per_generation"] / by["loglik", n]["seconds_per_generation"], 2
        )
        for n in args.populations if ("decode", n) in by and ("loglik", n) in by
    }
    print(json.dumps({"model": args.model, "batch": args.batch, "sigma": args.sigma, "new_tokens": args.new_tokens,
                      "results": results, **ratios}, indent=2))


if __name__ == "__main__":
    main()
