"""Where a demo generation's time goes: evaluation vs everything else.

Trains a few generations of the demo config (SmolLM2-135M-Instruct on arithmetic) into a
scratch ledger and prints, per generation, the seconds spent generating text and the
seconds spent outside it (building member weights from the master with fresh noise,
the update, the fingerprint, the ledger commit). Goal: overhead ≤ 10% of the generation.

    .venv/bin/python benchmarks/train_bench.py [--generations 2] [--model smollm2-135m-instruct]
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

from engine import session
from engine.demo import CONFIG
from engine.loop import Hooks
from ledger import Ledger


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--generations", type=int, default=2)
    parser.add_argument("--model", default=None)
    parser.add_argument("--population", type=int, default=None)
    args = parser.parse_args()
    overrides = [f"model={args.model}"] if args.model else []
    if args.population:
        overrides.append(f"population={args.population}")

    ends: list[float] = []
    hooks = Hooks(on_generation_end=lambda record, seconds: ends.append(time.perf_counter()))
    with tempfile.TemporaryDirectory() as tmp, Ledger.open(str(Path(tmp) / "bench.db")) as led:
        session.start(led, str(CONFIG), "bench", overrides, args.generations, hooks)
        records = [led.generation("bench", g) for g in range(1, args.generations + 1)]
    print(f"{'gen':>4} {'total s':>8} {'generate s':>10} {'member weights s':>16} {'update+fp s':>11} {'overhead':>9}")
    for i, rec in enumerate(records):
        t = rec.timings
        total = t["evaluate"] + t["update"] if i == 0 else ends[i] - ends[i - 1]
        generate = t["evaluate"] - t["load_member"]
        overhead = total - generate
        print(f"{rec.index:>4} {total:8.2f} {generate:10.2f} {t['load_member']:16.2f} "
              f"{t['update']:11.2f} {overhead / total:9.1%}")


if __name__ == "__main__":
    main()
