"""The update rules a run's stored config can record, and the check that a replay keeps to
them: a generation whose rule no run of its config could have recorded (Adam or momentum
under CMA-ES or a GA, whose config refuses them; a rule other than the one an ES config
names; `paths` outside LM-MA-ES and GA survivors) is refused in one line before anything
is replayed, so that its replay state (Adam's two moments, momentum's velocity) is never
built, nor counted by the rebuild-memory estimate. Stored configs are read as plain data
(replay cannot import the engine's config): what this judges is the algorithm and the
optimizer's name, each step's `optimizer.name` against them.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from seedledger.ledger.errors import SeedLedgerError

PATHS = "paths"  # replay.paths.NAME (not imported: replay.paths imports torch)


def allowed_rules(config: Any) -> frozenset[str] | None:
    """The rules a run of stored `config` records at its generations; None when the config
    does not say (an algorithm this does not know, or an ES config without an `optimizer`:
    a ledger written through the Python API stores what its caller gave), left to replay."""
    cfg = config if isinstance(config, dict) else {}
    algorithm = cfg.get("algorithm", "es")
    optimizer = cfg.get("optimizer")
    name = optimizer.get("name", "sgd") if isinstance(optimizer, dict) else optimizer
    if algorithm in ("lmmaes", "ga"):  # the paths rule (GA survivors), else SGD: the update applied as is
        return frozenset({"sgd", PATHS})
    if algorithm == "cmaes":
        return frozenset({"sgd"})
    if algorithm == "es" and isinstance(name, str):
        return frozenset({name})
    return None


def check_rules(config: Any, steps: Iterable[Any], run: str) -> None:
    """Refuse the first of `steps` (run `run`'s own, recorded under `config`) whose rule its
    config cannot record."""
    allowed = allowed_rules(config)
    if allowed is None:
        return
    for s in steps:
        name = (s.optimizer or {}).get("name", "sgd")
        if name not in allowed:
            algorithm = (config or {}).get("algorithm", "es")
            raise SeedLedgerError(
                f"run {run!r} generation {s.index} records update rule {str(name)[:40]!r}, which its config "
                f"(algorithm {str(algorithm)[:20]}) does not apply ({' or '.join(sorted(allowed))}): no training "
                "run records that; refused before replaying it")


def check_lineage_rules(ledger: Any, steps: list[Any]) -> None:
    """`check_rules` for a ledger's replay steps, each run's against its own config: a run's
    generations were all recorded under its config (resume keeps it; a fork is a run of its
    own), except those an import brought (its `import` event's `source`, RUN@G: 1..G), whose
    file was checked when it was read."""
    for run in dict.fromkeys(s.run for s in steps):
        info = ledger.get_run(run)
        imported = 0
        for e in ledger.events(run, "import"):
            g = str(e.payload.get("source", "")).rpartition("@")[2]
            imported = max(imported, int(g)) if g.isdigit() else imported
        check_rules(info.config, [s for s in steps if s.run == run and s.index > imported], run)
