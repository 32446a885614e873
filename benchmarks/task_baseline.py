"""Base-model mean test reward per task (greedy), so the demo task's difficulty can be checked.

    .venv/bin/python benchmarks/task_baseline.py --rows 64
    .venv/bin/python benchmarks/task_baseline.py --tasks countdown --max-new-tokens 128 --show 3
    .venv/bin/python benchmarks/task_baseline.py --tasks reasoning_gym:knights_knaves,code:humaneval \
        --task '{name: math, path: tests/data/math_competition.jsonl, test_path: tests/data/math_competition.jsonl}'

Uses the engine's model provisioning and HF backend (chat template, left padding, greedy),
i.e. exactly what training evaluates. Prints one line per task: mean reward, the share of
each reward value, the settings, and the seconds it took.
"""

from __future__ import annotations

import argparse
import collections
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402
import yaml  # noqa: E402

from seedledger.engine.runtime.backends.hf import HFBackend  # noqa: E402
from seedledger.engine.runtime.models.resolve import resolve_model  # noqa: E402
from seedledger.trainers.tasks import load_task  # noqa: E402


def summarize(rewards: list[float | None]) -> tuple[float, str]:
    """Mean over the rows that got a reward (None: no reward function applied; NaN when
    none did) and the share of each value, None included, e.g. ``0.0: 50%, 1.0: 25%, None: 25%``."""
    scored = [r for r in rewards if r is not None]
    mean = sum(scored) / len(scored) if scored else float("nan")
    shares = collections.Counter(None if r is None else round(r, 3) for r in rewards)
    order = sorted(shares.items(), key=lambda kv: (kv[0] is None, kv[0] or 0.0))
    return mean, ", ".join(f"{k}: {v / len(rewards):.0%}" for k, v in order)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2-135m-instruct")
    ap.add_argument("--tasks", default="arithmetic,countdown", help="task specs, comma-separated")
    ap.add_argument("--task", action="append", default=[],
                    help="one more task spec as YAML (a mapping with options); repeatable")
    ap.add_argument("--rows", type=int, default=64, help="test rows per task")
    ap.add_argument("--max-new-tokens", type=int, default=None, help="default: the task's own")
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--show", type=int, default=0, help="print this many completions per task")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)

    backend = HFBackend(resolve_model(args.model), batch_size=args.batch_size)
    specs: list = [t for t in args.tasks.split(",") if t] + [yaml.safe_load(t) for t in args.task]
    for spec in specs:
        task = load_task(spec, seed=0)
        rows = task.test_rows()[: args.rows]
        max_new = args.max_new_tokens or task.max_new_tokens or 32
        prompts = [task.prompt(r) for r in rows]
        started = time.perf_counter()
        completions = backend.generate(prompts, max_new, seed=None)
        seconds = time.perf_counter() - started
        rewards, components = task.reward(prompts, completions, rows)
        mean, dist = summarize(rewards)
        extra = "".join(f"; {name} {summarize(values)[0]:.3f}" for name, values in components.items()
                        if len(components) > 1)
        print(f"{task.name}: mean reward {mean:.3f} over {len(rows)} test rows "
              f"(greedy, max_new_tokens={max_new}, level={task.level}; {dist}{extra}) in {seconds:.0f} s")
        for r, c, rw in list(zip(rows, completions, rewards, strict=True))[: args.show]:
            print(f"  {'-' if rw is None else f'{rw:.1f}'}  {r}  ->  {c!r}")


if __name__ == "__main__":
    main()
