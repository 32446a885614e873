"""The CLI in a subprocess and a run's committed fingerprints: what the run tests
(kill-and-resume, verify, fork) check a ledger with."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from ledger import Ledger

ROOT = Path(__file__).resolve().parents[2]


def cli(*args: str | os.PathLike[str], env: dict | None = None, check: bool = True) -> subprocess.CompletedProcess:
    """`python -m engine.cli ARGS` from the repository root (paths may be given as Path);
    with `check`, a non-zero exit fails the test with the end of its stderr."""
    cmd = [sys.executable, "-m", "engine.cli", *map(str, args)]
    proc = subprocess.run(cmd, cwd=ROOT, env=env or os.environ.copy(), capture_output=True, text=True)
    if check and proc.returncode != 0:
        raise AssertionError(f"{cmd} exited {proc.returncode}: {proc.stderr[-2000:]}")
    return proc


def fingerprints(ledger_path: Path, run: str) -> list[str]:
    """Generations 1.. of `run`, their fingerprints in order."""
    with Ledger.open(str(ledger_path)) as led:
        return [led.generation(run, g).fingerprint for g in range(1, led.latest_generation(run) + 1)]
