"""The CLI in a subprocess and a run's committed fingerprints: what the run tests
(kill-and-resume, verify, fork) check a ledger with."""

from __future__ import annotations

import json
import os
import signal
import subprocess
from pathlib import Path

from seedledger.ledger import Ledger
from tests.support.cli import seedledger

ROOT = Path(__file__).resolve().parents[2]


def cli(*args: str | os.PathLike[str], env: dict | None = None, check: bool = True,
        process: bool = False) -> subprocess.CompletedProcess:
    """`seedledger ARGS` from the repository root (paths may be given as Path), in this
    process unless `process` or a failpoint is armed (tests.support.cli); with `check`, a
    non-zero exit fails the test with the end of its stderr."""
    proc = seedledger(args, cwd=ROOT, env=env, process=process)
    if check and proc.returncode != 0:
        raise AssertionError(f"seedledger {proc.args[1:]} exited {proc.returncode}: {proc.stderr[-2000:]}")
    return proc


def rebuilt_from_ledger_and_seed_file(ref: str, ledger_path: Path, tmp_path: Path) -> tuple[dict, dict]:
    """`ref` exported as tmp_path/ref.seeds, then rebuilt from the ledger into tmp_path/a and
    from the seed file into tmp_path/b: both `rebuild --json` reports (ledger's first)."""
    cli("export", ref, "-o", tmp_path / "ref.seeds", "--ledger", ledger_path)
    from_ledger = json.loads(cli("rebuild", ref, "-o", tmp_path / "a", "--json", "--ledger", ledger_path).stdout)
    from_seeds = json.loads(cli("rebuild", tmp_path / "ref.seeds", "-o", tmp_path / "b", "--json").stdout)
    return from_ledger, from_seeds


def fingerprints(ledger_path: Path, run: str) -> list[str]:
    """Generations 1.. of `run`, their fingerprints in order."""
    with Ledger.open(str(ledger_path)) as led:
        return [led.generation(run, g).fingerprint for g in range(1, led.latest_generation(run) + 1)]


def kill_train_and_resume(config: Path, ledger_path: Path, reference: list[str], failpoint: str = "member@2") -> None:
    """`train CONFIG` SIGKILLed at `failpoint` keeps exactly the generations before it, and
    `resume` then reaches the uninterrupted run's fingerprints `reference` bit for bit."""
    from seedledger.engine.runtime import session

    cmd = ["train", str(config), "--run", "c", "--ledger", str(ledger_path)]
    proc = cli(*cmd, env=os.environ | {"SEEDLEDGER_FAILPOINT": failpoint}, check=False)
    assert proc.returncode == -signal.SIGKILL, proc.stderr[-2000:]
    killed_in = int(failpoint.rpartition("@")[2])
    assert fingerprints(ledger_path, "c") == reference[: killed_in - 1]
    with Ledger.open(str(ledger_path)) as led:
        assert session.resume(led, "c", None).latest_generation == len(reference)
    assert fingerprints(ledger_path, "c") == reference
