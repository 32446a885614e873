"""hf against vLLM on one run shape: what `backend: auto` chooses by (engine/runtime/backends/choice.py).

Trains the same config for a few generations with `--set backend=hf` and `--set
backend=vllm`, each through the console script in its own process (vLLM binds the
process's OpenMP threads), and prints the command's wall time (engine start included) and
the seconds of each generation (`log --json`). The shipped examples are written into a
fresh directory first, so `--config demo` or `--config jsonl` name them.

    .venv/bin/python benchmarks/backend_choice_bench.py --config demo --generations 3
    .venv/bin/python benchmarks/backend_choice_bench.py --config jsonl --set perturbation=full \
        --set population=8 --generations 3
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

SEEDLEDGER = [sys.executable, "-m", "seedledger.engine.cli"]
DATA = {"demo": ("data/words.jsonl", "words.jsonl"), "jsonl": ("opposites.jsonl", "opposites.jsonl")}


def _cli(*args: str, cwd: Path) -> str:
    return subprocess.run([*SEEDLEDGER, *args], cwd=cwd, check=True, capture_output=True, text=True).stdout


def _write_example(name: str, work: Path) -> Path:
    """The shipped example `name` (and the data file it reads) in `work`."""
    (work / f"{name}.yaml").write_text(_cli("example", name, cwd=work))
    if name in DATA:
        path, example = DATA[name]
        (work / path).parent.mkdir(parents=True, exist_ok=True)
        (work / path).write_text(_cli("example", example, cwd=work))
    return work / f"{name}.yaml"


def measure(config: Path, backend: str, generations: int, overrides: list[str], work: Path) -> dict:
    sets = [a for o in [*overrides, f"backend={backend}"] for a in ("--set", o)]
    started = time.perf_counter()
    _cli("train", str(config), "--run", backend, "--generations", str(generations), *sets,
         "--ledger", "bench.db", "--json", cwd=work)
    wall = time.perf_counter() - started
    gens = json.loads(_cli("log", backend, "--ledger", "bench.db", "--json", cwd=work))["generations"]
    seconds = [g["seconds"] for g in gens]
    return {"backend": backend, "wall": wall, "per_generation": seconds,
            "steady": statistics.median(seconds[1:]) if len(seconds) > 1 else seconds[0]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", default="demo", help="a shipped example's name, or a YAML file")
    parser.add_argument("--set", dest="overrides", action="append", default=[], help="key=value, as train takes")
    parser.add_argument("--generations", type=int, default=3)
    parser.add_argument("--backends", nargs="+", default=["hf", "vllm"])
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        config = Path(args.config).resolve() if args.config.endswith(".yaml") else _write_example(args.config, work)
        for backend in args.backends:
            r = measure(config, backend, args.generations, args.overrides, work)
            per = ", ".join(f"{s:.1f}" for s in r["per_generation"])
            print(f"{r['backend']:>5}: {r['wall']:.1f} s in all; per generation {per} s "
                  f"(median after the first {r['steady']:.1f} s)", flush=True)


if __name__ == "__main__":
    main()
