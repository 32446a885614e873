"""What `import` and `rebuild FILE.seeds` check of a seed file before using it: what a replay
can apply (`replay.seedcheck`), then its stored config's task settings within their bounds
(`trainers.tasks.bounds`: a resume builds its datasets from them, and `train_size: 10**9`
would build 2 GB before any other limit applied)."""

from __future__ import annotations

from seedledger.ledger.seedfile import SeedFile
from seedledger.replay import seedcheck
from seedledger.trainers.tasks.bounds import check_task_settings


def check_seedfile(sf: SeedFile) -> None:
    """Raise SeedLedgerError naming the first value of `sf` a replay, or a resume, cannot use."""
    seedcheck.check_seedfile(sf)
    check_task_settings((sf.header.get("config") or {}).get("task"))


__all__ = ["check_seedfile"]
