"""The cost model's measured inputs (docs/scale.md): the driver's commit of one generation
against population N, and the update every worker replays (N noise passes over the
trained parameters) against N, full-rank vs low-rank, on `tiny` and on SmolLM2-135M's
linear shapes.

    .venv/bin/python benchmarks/scale_bench.py [--commit-ns 16 64 256 1024]
        [--update-ns 8 32 128] [--layers 6] [--repeat 3]

The commit is durable SQLite (WAL, synchronous=FULL), under the run's writer lease as in
the loop (benchmarks/ledger_bench.py's record: mirrored ES pairs). The update is
`replay.update.apply_step` with SGD, best of --repeat after a warm-up; `--layers` of
SmolLM2's 30 decoder layers' linears (6 give 21.2 M weights; the whole model scales by 5).
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from ledger_bench import es_record  # noqa: E402
from replay_bench import best, linear_master  # noqa: E402

from seedledger.ledger import Ledger, ReplayStep  # noqa: E402
from seedledger.replay import noise, update  # noqa: E402
from seedledger.replay.perturbation import Perturbation  # noqa: E402


def commit_ms(directory: Path, n: int, commits: int = 25) -> tuple[float, float]:
    """(median wall ms, median CPU ms) of committing one N-member generation."""
    rng = random.Random(n)
    with Ledger.open(directory / f"commit{n}.db") as led:
        led.create_run("c", base_model="tiny", noise_spec="v1", run_key=1)
        records = [es_record(g, n, 1, rng) for g in range(1, commits + 1)]
        wall, cpu = [], []
        with led.lease("c"):
            for record in records:
                t, c = time.perf_counter(), time.process_time()
                led.commit_generation("c", record)
                wall.append(time.perf_counter() - t)
                cpu.append(time.process_time() - c)
    return statistics.median(wall[5:]) * 1e3, statistics.median(cpu[5:]) * 1e3


def tiny_master() -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    from seedledger.engine.runtime.models.resolve import resolve_model

    (path,) = resolve_model("tiny").glob("*.safetensors")
    return {k: v.float().contiguous() for k, v in load_file(str(path)).items() if v.dim() == 2}


def update_seconds(master: dict[str, torch.Tensor], n: int, kind: Perturbation, repeat: int) -> float:
    keys = [noise.member_key(1, 1, i) for i in range(n)]
    coefs = [noise.round_coefficient(1e-3 * (i % 7 - 3)) for i in range(n)]
    step = ReplayStep("bench", 1, keys, coefs, 1e-3, {"name": "sgd"}, kind.noise_spec, kind.param_selection)
    state = update.OptimizerState()
    update.apply_step(master, state, step)  # warm-up (numba caches)
    return best(lambda: update.apply_step(master, state, step), repeat)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--commit-ns", type=int, nargs="+", default=[16, 64, 256, 1024])
    ap.add_argument("--update-ns", type=int, nargs="+", default=[8, 32, 128])
    ap.add_argument("--layers", type=int, default=6)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    torch.set_num_threads(1)  # one worker's share of a busy 2-core machine; numba likewise
    try:
        import numba

        numba.set_num_threads(1)
    except ImportError:
        pass
    with tempfile.TemporaryDirectory() as d:
        print("commit of one generation, durable SQLite, lease held (median of 20):")
        for n in args.commit_ns:
            wall, cpu = commit_ms(Path(d), n)
            print(f"  N={n:5d}: {wall:8.2f} ms wall, {cpu:8.2f} ms CPU, {wall / n * 1e3:7.1f} µs/member")
    masters = {"tiny": tiny_master(), f"SmolLM2 linears x{args.layers}": linear_master(args.layers, "cpu")}
    kinds = {"full": Perturbation(), "lowrank r=1": Perturbation.lowrank(1), "lowrank r=4": Perturbation.lowrank(4)}
    print(f"update replay (SGD, 1 thread, best of {args.repeat}):")
    for name, master in masters.items():
        numel = sum(t.numel() for t in master.values())
        for kind_name, kind in kinds.items():
            cells = []
            for n in args.update_ns:
                s = update_seconds(master, n, kind, args.repeat)
                cells.append(f"N={n}: {s:.4f} s ({s / n / numel * 1e9:.2f} ns/member-weight)")
            print(f"  {name} ({numel / 1e6:.2f} M weights), {kind_name}: " + "; ".join(cells))


if __name__ == "__main__":
    main()
