"""Ray overhead: one ES generation with W Ray workers vs the local pool, `tiny` model.

A generation here is what the loop times: score every member (`evaluate`), turn the
rewards into coefficients, apply the record on every replica (`apply`). The first
generation is a warm-up (first `generate` calls, kernel caches) and is not timed. Both
pools must reach the same fingerprints; the benchmark fails otherwise.

The local pool runs once per thread count in `--local-threads` (torch and numba), since
on a busy machine 2 spinning OpenMP threads can be far slower than 1; the ratio is
against the fastest local figure. Each Ray actor gets cores/W threads.

    .venv/bin/python benchmarks/ray_bench.py [--workers 2] [--population 8]
        [--batch-size 4] [--max-new-tokens 16] [--generations 3] [--local-threads 1 2]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

from seedledger.engine.config import validate
from seedledger.engine.runtime.loop import hyperparameters
from seedledger.engine.runtime.models.resolve import resolve_model
from seedledger.ledger import ReplayStep
from seedledger.replay.noise import run_key
from seedledger.trainers.es import ES


def one_generation(pool, cfg, strategy: ES, key: int, generation: int) -> tuple[float, str]:
    started = time.perf_counter()
    lr, sigma = hyperparameters(cfg, generation)
    members, state = strategy.ask(strategy.start(), key, generation, sigma=sigma)
    results = pool.evaluate(members, sigma, generation, key, pool.batch(generation))
    decision = strategy.decide(state, results, lr=lr, sigma=sigma, optimizer=cfg.optimizer)
    step = ReplayStep(
        run="bench",
        index=generation,
        keys=[m.key for m in members],
        coefficients=decision.coefficients,
        sigma=sigma,
        optimizer=decision.optimizer,
    )
    fingerprint = pool.apply(step)
    return time.perf_counter() - started, fingerprint


def measure(kind: str, cfg, generations: int) -> tuple[float, list[float], list[str]]:
    """(startup seconds, timed seconds per generation, fingerprints)."""
    started = time.perf_counter()
    if kind == "ray":
        from seedledger.engine.runtime.pools.ray import RayPool

        pool = RayPool(cfg, resolve_model(cfg.model))
    else:
        from seedledger.engine.runtime.pools.local import LocalPool

        pool = LocalPool(cfg, resolve_model(cfg.model))
    startup = time.perf_counter() - started
    strategy = ES(cfg.population, mirrored=cfg.mirrored, shaping=cfg.shaping)
    key = run_key(cfg.seed)
    seconds, fingerprints = [], []
    try:
        for generation in range(1, generations + 2):
            took, fp = one_generation(pool, cfg, strategy, key, generation)
            fingerprints.append(fp)
            if generation > 1:
                seconds.append(took)
    finally:
        pool.close()
    return startup, seconds, fingerprints


def set_threads(threads: int) -> None:
    import torch

    torch.set_num_threads(threads)
    try:
        import numba

        numba.set_num_threads(min(threads, numba.config.NUMBA_NUM_THREADS))
    except ImportError:
        pass


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--population", type=int, default=8)
    parser.add_argument("--batch-size", type=int, default=4)
    parser.add_argument("--max-new-tokens", type=int, default=16)
    parser.add_argument("--generations", type=int, default=3, help="timed, after one warm-up")
    parser.add_argument(
        "--local-threads", type=int, nargs="+", default=sorted({1, os.cpu_count() or 1})
    )
    args = parser.parse_args()
    base = {
        "model": "tiny",
        "task": {"name": "arithmetic", "rewards": ["task", {"fn": "length", "limit": 24}]},
        "population": args.population,
        "batch_size": args.batch_size,
        "max_new_tokens": args.max_new_tokens,
        "sigma": 0.05,
        "lr": 0.01,
    }
    local_cfg = validate(base)
    ray_cfg = validate({**base, "workers": {"pool": "ray", "count": args.workers}})
    resolve_model("tiny")  # provision outside the timings

    runs = {}
    for threads in args.local_threads:
        set_threads(threads)
        runs[f"local {threads}t"] = measure("local", local_cfg, args.generations)
    set_threads(1)  # the driver only waits on the actors
    runs[f"ray x{args.workers}"] = remote = measure("ray", ray_cfg, args.generations)
    for name, (_, _, fps) in runs.items():
        if fps != remote[2]:
            raise SystemExit(f"fingerprints differ: {name} {fps} vs ray {remote[2]}")

    print(
        f"tiny, population {args.population}, batch {args.batch_size}, "
        f"{args.max_new_tokens} new tokens, {args.generations} timed generations, "
        f"{os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f}"
    )
    for name, (startup, seconds, _) in runs.items():
        print(
            f"{name:>9}: startup {startup:6.2f} s, generation median "
            f"{statistics.median(seconds):6.3f} s (min {min(seconds):.3f}, max {max(seconds):.3f})"
        )
    best = min(statistics.median(r[1]) for name, r in runs.items() if name.startswith("local"))
    ratio = best / statistics.median(remote[1])
    print(f"ray vs fastest local, per generation: {ratio:.2f}x (>1: Ray faster); fingerprints equal")


if __name__ == "__main__":
    main()
