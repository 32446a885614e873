"""What held-out evaluation costs: one training session with `evaluation.every` against the
same session without it (the ratio is the overhead; fingerprints must be equal), and one
`evaluate RUN` (base and latest on the same rows) against one generation's wall time.
Prints one JSON document.

    python benchmarks/evaluate_bench.py [--model tiny] [--generations 6] [--every 2] [--rows 16]
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import seedledger as sl


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="tiny", help="smollm2-135m-instruct for the real thing")
    p.add_argument("--generations", type=int, default=6)
    p.add_argument("--every", type=int, default=2)
    p.add_argument("--rows", type=int, default=16)
    args = p.parse_args()
    config = {
        "model": args.model, "task": {"name": "arithmetic", "rewards": ["task", {"fn": "length", "limit": 20}]},
        "population": 4, "batch_size": 4, "max_new_tokens": 8, "seed": 7, "sigma": 0.05, "lr": 0.05,
        "generations": args.generations, "evaluation": {"rows": args.rows},
    }
    with tempfile.TemporaryDirectory() as tmp:
        db = Path(tmp) / "bench.db"
        seconds = {}
        for run, evaluation in (("plain", {"rows": args.rows}), ("every", {"rows": args.rows, "every": args.every})):
            started = time.perf_counter()
            result = sl.train({**config, "evaluation": evaluation}, run=run, ledger=db)
            seconds[run] = time.perf_counter() - started
            seconds[f"{run}_fingerprint"] = result.fingerprint
        started = time.perf_counter()
        evaluated = sl.evaluate("plain", ledger=db)
        seconds["evaluate"] = time.perf_counter() - started
        with sl.open_ledger(db) as led:
            events = [e.payload["generation"] for e in led.events("every", "evaluation")]
    print(json.dumps({
        "model": args.model, "generations": args.generations, "every": args.every, "rows": args.rows,
        "train_seconds": round(seconds["plain"], 2),
        "train_with_every_seconds": round(seconds["every"], 2),
        "overhead_ratio": round(seconds["every"] / seconds["plain"], 3),
        "evaluated_at": events,
        "fingerprints_equal": seconds["plain_fingerprint"] == seconds["every_fingerprint"],
        "evaluate_seconds": round(seconds["evaluate"], 2),
        "evaluate_per_train_generation": round(seconds["evaluate"] / (seconds["plain"] / args.generations), 2),
        "held_out_change": evaluated.change,
    }, indent=2))


if __name__ == "__main__":
    main()
