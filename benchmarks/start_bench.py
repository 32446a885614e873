"""Start times of the command line (issue 45 item 3), beside Python's and torch's own.

    .venv/bin/python benchmarks/start_bench.py [--runs 5] [--keep DIR]

Every figure is the median wall time of `--runs` fresh processes (after one untimed
warm-up each, so the OS file cache, numba's on-disk cache and the `tiny` model are in
place), measured in one run with the commands interleaved round by round, so that a
change in the machine's load falls on all of them alike:

- `python -c pass` and `python -c "import torch"`: the floor any command stands on, and
  the floor of `train` on the transformers backend: torch and transformers imported, the
  `tiny` model and its tokenizer loaded (what HFBackend does first), without seedledger;
- `seedledger --help`, `seedledger log` and `seedledger show RUN@G` on a one-run ledger;
- `train` on the `tiny` model (the quickstart config) up to its first generation: the time
  from spawning the process until the line `generation 1: …` appears on its stdout, less
  that generation's own `timings.wall` as its record holds it (`show RUN@1 --json`), i.e.
  until the loop starts generation 1 (the commit, milliseconds, counts as start);
- `train --set generations=0` whole (start, model load, base fingerprint, run row, exit).

Beside each wall time, the median CPU time (user + system) of the same processes: on a
shared machine the wall time grows with the load, the CPU time much less, so it is the
better guess of the wall time a quiet machine shows (start-up runs on one core). The
goals (≤ 1 s for `--help`, `log`, `show`; ≤ 4 s to the first generation) are judged on
the wall medians.

`seedledger` runs as `python -m seedledger` (the console script is the same `main` behind
a five-line wrapper), so PYTHONPATH chooses the tree it measures.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

PY = sys.executable
SL = [PY, "-m", "seedledger"]
FLOOR = """
import sys, torch
from transformers import AutoModelForCausalLM, AutoTokenizer
AutoModelForCausalLM.from_pretrained(sys.argv[1], dtype=torch.float32, local_files_only=True, use_safetensors=True)
AutoTokenizer.from_pretrained(sys.argv[1], local_files_only=True)
"""
GOALS = {"seedledger --help": 1.0, "seedledger log": 1.0, "seedledger show RUN@G": 1.0,
         "train tiny: first generation starts": 4.0}


def reap(proc: subprocess.Popen, t: float) -> tuple[float, float]:
    """Wait for `proc` (started at perf_counter `t`): its wall seconds and CPU seconds
    (user + system, its own children included); it must have succeeded."""
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - t
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(map(str, proc.args))} failed (exit {proc.returncode})")
    return wall, usage.ru_utime + usage.ru_stime


def run(cmd: list[str], cwd: Path) -> tuple[float, float]:
    """(wall, CPU) seconds of one fresh process."""
    t = time.perf_counter()
    return reap(subprocess.Popen(cmd, cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL), t)


class FirstGeneration:
    """`train` runs named t1, t2, … into one ledger (it exists: no schema creation is timed)."""

    def __init__(self, cwd: Path) -> None:
        self.cwd = cwd
        self.count = 0

    def __call__(self) -> tuple[float, float | None]:
        self.count += 1
        name = f"t{self.count}"
        cmd = [*SL, "train", "q.yaml", "--run", name, "--set", "model=tiny", "--set", "generations=1",
               "--ledger", "bench.db"]
        t = time.perf_counter()
        proc = subprocess.Popen(cmd, cwd=self.cwd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        seen = None
        for text in proc.stdout:  # plain lines, flushed one by one (stdout is a pipe)
            if seen is None and text.startswith("generation 1:"):
                seen = time.perf_counter() - t
        reap(proc, t)
        if seen is None:
            raise SystemExit(f"train {name} printed no `generation 1:` line")
        shown = subprocess.run([*SL, "show", f"{name}@1", "--json", "--ledger", "bench.db"], cwd=self.cwd,
                               check=True, capture_output=True, text=True)
        # no CPU figure: by the line, the generation has run on every core (see generations=0)
        return seen - json.loads(shown.stdout)["timings"]["wall"], None


def setup(work: Path) -> None:
    """The quickstart config and a one-run ledger for `log` and `show`."""
    config = subprocess.run([*SL, "example", "quickstart"], cwd=work, check=True, capture_output=True, text=True)
    (work / "q.yaml").write_text(config.stdout)
    for ledger, run_name, generations in (("small.db", "small", 1), ("bench.db", "t0", 0)):
        subprocess.run([*SL, "train", "q.yaml", "--run", run_name, "--set", "model=tiny", "--set",
                        f"generations={generations}", "--ledger", ledger], cwd=work, check=True, capture_output=True)


def measurements(work: Path) -> dict[str, Callable[[], tuple[float, float | None]]]:
    zero = iter(range(1, 1 << 30))
    where_tiny = "from seedledger.engine.runtime.models.resolve import resolve_model as r; print(r('tiny'))"
    tiny = subprocess.run([PY, "-c", where_tiny], check=True, capture_output=True, text=True).stdout.strip()
    return {
        "python -c pass": lambda: run([PY, "-c", "pass"], work),
        "python -c 'import torch'": lambda: run([PY, "-c", "import torch"], work),
        "python: torch, transformers, tiny loaded": lambda: run([PY, "-c", FLOOR, tiny], work),
        "seedledger --help": lambda: run([*SL, "--help"], work),
        "seedledger log": lambda: run([*SL, "log", "--ledger", "small.db"], work),
        "seedledger show RUN@G": lambda: run([*SL, "show", "small@1", "--ledger", "small.db"], work),
        "train tiny: first generation starts": FirstGeneration(work),
        "train tiny --set generations=0 (whole)": lambda: run(
            [*SL, "train", "q.yaml", "--run", f"z{next(zero)}", "--set", "model=tiny", "--set", "generations=0",
             "--ledger", "bench.db"], work),
    }


def describe() -> str:
    where = subprocess.run([PY, "-c", "import seedledger, torch; print(seedledger.__file__, torch.__version__)"],
                           check=True, capture_output=True, text=True).stdout.split()
    commit = subprocess.run(["git", "-C", str(Path(where[0]).parent), "rev-parse", "--short", "HEAD"],
                            capture_output=True, text=True).stdout.strip() or "?"
    return (f"seedledger {where[0]} (git {commit}), torch {where[1]}, Python {platform.python_version()}, "
            f"{os.cpu_count()} CPUs, load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5, help="timed processes per command (median)")
    parser.add_argument("--keep", type=Path, help="work in DIR and keep it (default: a temporary directory)")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="start_bench-")) if args.keep is None else args.keep
    work.mkdir(parents=True, exist_ok=True)
    try:
        print(describe(), flush=True)
        setup(work)
        todo = measurements(work)
        for fn in todo.values():  # warm-up: file cache, numba cache, the model
            fn()
        times: dict[str, list[tuple[float, float | None]]] = {name: [] for name in todo}
        for _ in range(args.runs):
            for name, fn in todo.items():
                times[name].append(fn())
        print(f"median of {args.runs} fresh processes: wall seconds (min–max), and CPU seconds (user + "
              f"system; under load, nearer what a quiet machine's wall shows); load average now "
              f"{' '.join(f'{x:.2f}' for x in os.getloadavg())}")
        for name, pairs in times.items():
            walls, cpus = [w for w, _ in pairs], [c for _, c in pairs if c is not None]
            median = statistics.median(walls)
            cpu = f"{statistics.median(cpus):5.2f}" if cpus else "    –"
            goal = GOALS.get(name)
            verdict = "" if goal is None else f"goal ≤ {goal:.1f} s: {'met' if median <= goal else 'NOT met'}"
            print(f"  {name:<40} {median:6.2f} ({min(walls):5.2f}–{max(walls):5.2f})  cpu {cpu}  {verdict}")
    finally:
        if args.keep is None:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
