"""Where a demo generation's time goes: evaluation vs everything else.

Trains a few generations of the demo config (SmolLM2-135M-Instruct on arithmetic) into a
scratch ledger and prints, per generation, the seconds spent generating text and the
seconds spent outside it (building member weights from the master with fresh noise,
the update, the fingerprint, the ledger commit). Goal: overhead ≤ 10% of the generation.

A generation's total is the loop's own measure (`Hooks.on_generation_end`'s seconds:
from the generation's start to the end of its commit), so every generation, the first
included, counts its commit. The commit column comes from the next record's
`previous_commit` timing (a record cannot hold its own commit's time); the last
generation's commit is total − evaluate − update.

    .venv/bin/python benchmarks/train_bench.py [--generations 2] [--model smollm2-135m-instruct]
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

from seedledger.engine.cli.demo import CONFIG
from seedledger.engine.runtime import session
from seedledger.engine.runtime.hooks import Hooks
from seedledger.ledger import Ledger


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--generations", type=int, default=2)
    parser.add_argument("--model", default=None)
    parser.add_argument("--population", type=int, default=None)
    args = parser.parse_args()
    overrides = [f"model={args.model}"] if args.model else []
    if args.population:
        overrides.append(f"population={args.population}")

    totals: list[float] = []
    hooks = Hooks(on_generation_end=lambda record, seconds: totals.append(seconds))
    with tempfile.TemporaryDirectory() as tmp, Ledger.open(str(Path(tmp) / "bench.db")) as led:
        session.start(led, str(CONFIG), "bench", overrides, args.generations, hooks)
        records = [led.generation("bench", g) for g in range(1, args.generations + 1)]
    print(f"{'gen':>4} {'total s':>8} {'generate s':>10} {'member weights s':>16} {'update+fp s':>11} "
          f"{'commit s':>8} {'overhead':>9}")
    for i, (rec, total) in enumerate(zip(records, totals, strict=True)):
        t = rec.timings
        later = records[i + 1].timings if i + 1 < len(records) else {}
        commit = later.get("previous_commit", total - t["evaluate"] - t["update"])
        generate = t["evaluate"] - t["load_member"]
        overhead = total - generate
        print(f"{rec.index:>4} {total:8.2f} {generate:10.2f} {t['load_member']:16.2f} "
              f"{t['update']:11.2f} {commit:8.3f} {overhead / total:9.1%}")


if __name__ == "__main__":
    main()
