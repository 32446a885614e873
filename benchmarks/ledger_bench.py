"""Ledger benchmarks (docs/design.md seed-file size target, issue 3 goals): commit latency,
replay-history read, seed-file size.

    .venv/bin/python benchmarks/ledger_bench.py [--dir DIR]

Goals: commit of one 256-member generation <= 5 ms median; replay history of
10,000 generations x N=32 <= 1 s; seed file for 500 generations x N=30 <= 100 KB.
The commit is durable (WAL, synchronous=FULL: one fsync per commit), so its latency
includes this disk's fsync, which is printed beside it. Commits run under the run's writer
lease, as in the real loop: each commit checks and refreshes the lease row in the same
transaction.
"""

from __future__ import annotations

import argparse
import math
import os
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from seedledger.ledger import GenerationRecord, Ledger, MemberRecord  # noqa: E402
from seedledger.ledger.seedfile import read_seedfile  # noqa: E402
from seedledger.ledger.seedio import export_seedfile  # noqa: E402

M64 = (1 << 64) - 1

try:  # the real key derivation and rounding when replay is built
    from seedledger.replay.noise import member_key, round_coefficient  # noqa: E402
except Exception:  # noqa: BLE001 - stand-ins with the same shape

    def member_key(run_key: int, g: int, j: int) -> int:
        z = (run_key ^ (g * 0x9E3779B97F4A7C15) ^ (j * 0xD1B54A32D192ED03)) & M64
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & M64
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & M64
        return z ^ (z >> 31)

    def round_coefficient(x: float) -> float:
        if x == 0:
            return 0.0
        m, e = math.frexp(x)
        return math.ldexp(round(m * 4096) / 4096, e)


def es_record(g: int, n: int, run_key: int, rng: random.Random) -> GenerationRecord:
    """A generation as trainers.es makes it: mirrored pairs, coefficients (c, 0.0)."""
    members = []
    for pair in range(n // 2):
        k = member_key(run_key, g, pair)
        c = round_coefficient(rng.gauss(0, 1) * 5e-4 / n)
        members += [
            MemberRecord(2 * pair, k, 1, rng.random(), c, {"format": 1.0, "answer": rng.random()}),
            MemberRecord(2 * pair + 1, k, -1, rng.random(), 0.0, {"format": 1.0, "answer": 0.0}),
        ]
    return GenerationRecord(
        index=g,
        lr=5e-4,
        sigma=1e-3,
        population=n,
        optimizer={"name": "sgd", "lr": 5e-4},
        schedule_step=g - 1,
        batch_indices=list(range(g * 16, g * 16 + 16)),
        members=members,
        fingerprint=f"{rng.getrandbits(128):032x}",
        timings={"eval": 1.5, "update": 0.02},
    )


def fsync_ms(d: Path) -> float:
    fd = os.open(d / "fsync.probe", os.O_WRONLY | os.O_CREAT)
    times = []
    for _ in range(30):
        os.write(fd, b"x" * 4096)
        t = time.perf_counter()
        os.fsync(fd)
        times.append(time.perf_counter() - t)
    os.close(fd)
    return statistics.median(times) * 1e3


def bench_commit(d: Path) -> None:
    rng = random.Random(1)
    with Ledger.open(d / "commit.db") as led:
        led.create_run("c", base_model="tiny", noise_spec="v1", run_key=1)
        recs = [es_record(g, 256, 1, rng) for g in range(1, 121)]
        wall, cpu = [], []
        with led.lease("c"):  # as engine.runtime.loop does: the commit refreshes the lease row
            for r in recs:
                t, c = time.perf_counter(), time.process_time()
                led.commit_generation("c", r)
                wall.append(time.perf_counter() - t)
                cpu.append(time.process_time() - c)
            assert led.events("c", "lease-acquired")
    wall, cpu = wall[20:], cpu[20:]
    print(
        f"commit 256-member generation (lease held): median {statistics.median(wall) * 1e3:.2f} ms wall "
        f"(p90 {sorted(wall)[int(0.9 * len(wall))] * 1e3:.2f} ms), "
        f"{statistics.median(cpu) * 1e3:.2f} ms CPU; disk fsync median {fsync_ms(d):.2f} ms "
        f"[goal <= 5 ms]"
    )


def bench_replay(d: Path, gens: int = 10_000, n: int = 32) -> None:
    rng = random.Random(2)
    with Ledger.open(d / "replay.db") as led:
        t = time.perf_counter()
        led.import_run(
            "r",
            [es_record(g, n, 2, rng) for g in range(1, gens + 1)],
            base_model="tiny",
            noise_spec="v1",
            run_key=2,
        )
        build = time.perf_counter() - t
    with Ledger.open(d / "replay.db") as led:
        times = []
        for _ in range(3):
            t = time.perf_counter()
            steps = led.replay_history("r")
            times.append(time.perf_counter() - t)
        assert len(steps) == gens and len(steps[-1].keys) == n
    print(
        f"replay_history {gens} gen x N={n}: median {statistics.median(times) * 1e3:.0f} ms "
        f"(built in {build:.1f} s) [goal <= 1000 ms]"
    )


def bench_seedfile(d: Path, gens: int = 500, n: int = 30) -> None:
    rng = random.Random(3)
    with Ledger.open(d / "seeds.db") as led:
        led.import_run(
            "s",
            [es_record(g, n, 3, rng) for g in range(1, gens + 1)],
            base_model="tiny",
            noise_spec="v1",
            run_key=3,
        )
        t = time.perf_counter()
        export_seedfile(led, "s", None, d / "s.seeds", key_fn=member_key)
        export_t = time.perf_counter() - t
        export_seedfile(led, "s", None, d / "s_raw.seeds")
        t = time.perf_counter()
        sf = read_seedfile(d / "s.seeds", key_fn=member_key)
        read_t = time.perf_counter() - t
        assert [s.keys for s in sf.steps] == [s.keys for s in led.replay_history("s")]
    size, raw = (d / "s.seeds").stat().st_size, (d / "s_raw.seeds").stat().st_size
    print(
        f"seed file {gens} gen x N={n}: {size / 1000:.1f} KB with key_fn "
        f"({raw / 1000:.1f} KB with raw keys); export {export_t * 1e3:.0f} ms, "
        f"read {read_t * 1e3:.0f} ms; {1e9 / size:,.0f}x smaller than a 1 GB checkpoint "
        f"[goal <= 100 KB]"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dir", help="where to put the ledgers (default: a temp dir)")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        d = Path(tmp)
        bench_commit(d)
        bench_replay(d)
        bench_seedfile(d)


if __name__ == "__main__":
    main()
