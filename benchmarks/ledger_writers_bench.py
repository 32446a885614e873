"""Many writers on one ledger: commits per second and commit latency (p50, p99) for 1, 4
and 8 processes committing at once, each its own run under its own writer lease, on SQLite
(WAL, synchronous=FULL) and on PostgreSQL (fsync and synchronous_commit on).

    .venv/bin/python benchmarks/ledger_writers_bench.py [--commits 200] [--population 32]
        [--writers 1 4 8] [--postgres URL | --no-postgres]

Each writer commits `--commits` generations of an ES-shaped record (mirrored pairs,
`--population` members) as fast as it can; latency is the wall time of
`commit_generation` (one transaction: lease check and refresh, generation row, members,
hash-chain digest). Without --postgres a throw-away server is started (initdb + pg_ctl,
tests/support/pgserver.py) with durable settings. Every run is checked afterwards:
exactly `--commits` generations each and an intact hash chain.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from ledger_bench import es_record  # noqa: E402

from seedledger.ledger import Ledger  # noqa: E402


def _writer(url: str, run: str, commits: int, population: int, barrier, out) -> None:
    rng = random.Random(run)
    with Ledger.open(url) as led:
        led.create_run(run, base_model="tiny", noise_spec="v1", run_key=rng.getrandbits(64))
        records = [es_record(g, population, 7, rng) for g in range(1, commits + 1)]
        with led.lease(run, ttl=300):
            barrier.wait()
            began = time.perf_counter()
            took = []
            for rec in records:
                t = time.perf_counter()
                led.commit_generation(run, rec)
                took.append(time.perf_counter() - t)
            out.put((run, began, time.perf_counter(), took))


def measure(url: str, writers: int, commits: int, population: int) -> dict[str, float]:
    ctx = mp.get_context("spawn")
    barrier, out = ctx.Barrier(writers), ctx.Queue()
    tag = f"w{writers}-{time.time_ns()}"
    procs = [ctx.Process(target=_writer, args=(url, f"{tag}-{k}", commits, population, barrier, out))
             for k in range(writers)]
    for p in procs:
        p.start()
    results = [out.get(timeout=1800) for _ in procs]
    for p in procs:
        p.join(60)
        assert p.exitcode == 0, f"a writer failed ({p.exitcode})"
    lat = sorted(t for *_, took in results for t in took)
    span = max(r[2] for r in results) - min(r[1] for r in results)
    with Ledger.open(url) as led:
        for run, *_ in results:
            assert led.check_chain(run)[1] == commits and led.latest_generation(run) == commits
    return {
        "commits_per_s": len(lat) / span,
        "p50_ms": 1000 * statistics.median(lat),
        "p99_ms": 1000 * lat[min(len(lat) - 1, int(0.99 * len(lat)))],
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--commits", type=int, default=200, help="generations per writer")
    ap.add_argument("--population", type=int, default=32)
    ap.add_argument("--writers", type=int, nargs="+", default=[1, 4, 8])
    ap.add_argument("--postgres", help="an existing server's empty database (SQLAlchemy URL)")
    ap.add_argument("--no-postgres", action="store_true")
    args = ap.parse_args()

    targets: list[tuple[str, object]] = []
    tmp = Path(tempfile.mkdtemp(prefix="writers-bench-"))
    server = None
    if not args.no_postgres and not args.postgres:
        from tests.support.pgserver import PgServer, PgUnavailable

        try:
            server = PgServer.start(fsync=True)
        except PgUnavailable as exc:
            print(f"PostgreSQL skipped: {exc}")
    try:
        print(f"{'database':<12}{'writers':>8}{'commits/s':>12}{'p50 ms':>9}{'p99 ms':>9}"
              f"   ({args.commits} commits each, population {args.population})")
        for n in args.writers:
            targets = [("sqlite", str(tmp / f"bench-{n}.db"))]
            if args.postgres:
                targets.append(("postgresql", args.postgres))
            elif server is not None:
                targets.append(("postgresql", server.database("bench")))
            for name, url in targets:
                Ledger.open(url).close()  # the schema first; writers then only commit
                r = measure(url, n, args.commits, args.population)
                print(f"{name:<12}{n:>8}{r['commits_per_s']:>12.0f}{r['p50_ms']:>9.1f}{r['p99_ms']:>9.1f}",
                      flush=True)
    finally:
        if server is not None:
            server.stop()


if __name__ == "__main__":
    main()
