"""The generation loop end to end on the `tiny` model: determinism, resume, fork, crashes.

Real ledgers on disk, the real HF backend, real subprocesses killed with SIGKILL.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from engine import session
from ledger import Ledger

ROOT = Path(__file__).resolve().parent.parent
TINY = {
    "model": "tiny",
    "task": {"name": "arithmetic", "rewards": ["task", {"fn": "tests.support.rewards:vowel_share"}]},
    "population": 4,
    "sigma": 0.05,
    "lr": 0.05,
    "generations": 3,
    "batch_size": 3,
    "max_new_tokens": 6,
    "seed": 7,
}


def write_config(tmp_path: Path, **changes) -> Path:
    path = tmp_path / "tiny.yaml"
    path.write_text(yaml.safe_dump(TINY | changes))
    return path


def fingerprints(ledger_path: Path, run: str) -> list[str]:
    with Ledger.open(str(ledger_path)) as led:
        return [led.generation(run, g).fingerprint for g in range(1, led.latest_generation(run) + 1)]


def _has_run(ledger_path: Path, run: str) -> bool:
    if not ledger_path.exists():
        return False
    with Ledger.open(str(ledger_path)) as led:
        return any(r.name == run for r in led.list_runs())


@pytest.fixture(scope="module")
def reference(tmp_path_factory, tiny_model_dir) -> tuple[Path, list[str]]:
    """An uninterrupted 3-generation run: the bits every other path must reach."""
    tmp = tmp_path_factory.mktemp("reference")
    ledger_path = tmp / "ref.db"
    with Ledger.open(str(ledger_path)) as led:
        result = session.start(led, str(write_config(tmp)), "ref", [], None)
    fps = fingerprints(ledger_path, "ref")
    assert len(fps) == 3 and result.fingerprint == fps[-1]
    return ledger_path, fps


def test_updates_happen_and_replay_verifies(reference):
    ledger_path, fps = reference
    with Ledger.open(str(ledger_path)) as led:
        base = led.get_run("ref").base_fingerprint
        records = [led.generation("ref", g) for g in (1, 2, 3)]
    assert len(set(fps + [base])) == 4, "every generation must move the weights"
    for rec in records:
        assert any(m.coefficient != 0.0 for m in rec.members)
        assert set(rec.members[0].components) == {"arithmetic", "tests.support.rewards:vowel_share"}
        assert rec.batch_indices and len(rec.batch_indices) == TINY["batch_size"]
    from engine.rebuilding import verify_ref

    with Ledger.open(str(ledger_path)) as led:
        assert verify_ref(led, "ref@3")["fingerprint"] == fps[-1]


def test_same_seed_same_bits_whatever_the_name(reference, tmp_path):
    _, fps = reference
    with Ledger.open(str(tmp_path / "other.db")) as led:
        session.start(led, str(write_config(tmp_path)), "another-name", [], None)
    assert fingerprints(tmp_path / "other.db", "another-name") == fps


def test_resume_reaches_the_uninterrupted_bits(reference, tmp_path):
    _, fps = reference
    path = tmp_path / "resume.db"
    with Ledger.open(str(path)) as led:
        session.start(led, str(write_config(tmp_path)), "r", [], 1)
        session.resume(led, "r", None)  # the config says 3: two more
        with pytest.raises(Exception, match="exists"):
            session.start(led, str(write_config(tmp_path)), "r", [], 1)
        again = session.resume(led, "r", None)  # finished: nothing to add, same answer
        assert (again.records, again.latest_generation, again.fingerprint) == ([], 3, fps[-1])
        assert led.get_run("r").status == "finished"
    assert fingerprints(path, "r") == fps


def test_fork_shares_the_prefix_and_diverges(reference, tmp_path):
    ledger_path, fps = reference
    with Ledger.open(str(ledger_path)) as led:
        session.fork(led, "ref@1", "child", ["lr=0.1"], 2)
        child = [led.generation("child", g).fingerprint for g in (1, 2, 3)]
        assert led.get_run("child").parent == ("ref", 1)
        assert led.latest_generation("child") == 3
        with pytest.raises(Exception, match="latest generation is ref@3"):
            session.fork(led, "ref@9", "child2", [], 1)
    assert child[0] == fps[0]
    assert child[1] != fps[1]


def seedledger(*args: str, env: dict | None = None, check: bool = True) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "engine.cli", *args]
    proc = subprocess.run(cmd, cwd=ROOT, env=env or os.environ.copy(), capture_output=True, text=True)
    if check and proc.returncode != 0:
        raise AssertionError(f"{cmd} exited {proc.returncode}: {proc.stderr[-2000:]}")
    return proc


@pytest.mark.slow
@pytest.mark.parametrize(
    "failpoint", ["member@1", "evaluated@2", "applied@2", "committed@2", "member@3", "random"]
)
def test_sigkill_then_resume_reaches_the_same_bits(reference, tmp_path, failpoint):
    """SIGKILL during evaluation, after the update (before the commit), right after the commit,
    or at a random moment; `resume` must end at the uninterrupted fingerprints, with no
    generation lost or duplicated."""
    _, fps = reference
    config = write_config(tmp_path)
    ledger_path = tmp_path / "crash.db"
    env = os.environ.copy()
    cmd = ["train", str(config), "--run", "c", "--ledger", str(ledger_path), "--json"]
    if failpoint == "random":
        proc = subprocess.Popen([sys.executable, "-m", "engine.cli", *cmd], cwd=ROOT, env=env,
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(random.Random().uniform(1.0, 12.0))
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        if not _has_run(ledger_path, "c"):  # killed before the run was recorded:
            seedledger(*cmd, "--generations", "1")  # the user starts it again
    else:
        env["SEEDLEDGER_FAILPOINT"] = failpoint
        proc = seedledger(*cmd, env=env, check=False)
        assert proc.returncode == -signal.SIGKILL, proc.stderr[-2000:]
    done = fingerprints(ledger_path, "c")
    assert done == fps[: len(done)], "what was committed before the crash is whole and exact"
    out = seedledger("resume", "c", "--ledger", str(ledger_path), "--json")
    payload = json.loads(out.stdout)
    assert payload["latest_generation"] == 3
    assert fingerprints(ledger_path, "c") == fps


def test_curriculum_moves_the_level_and_resume_continues_it(tmp_path):
    """Every sample counts as a success (threshold −1), so with a window of 1 the level rises
    each generation; the level in force and each change commit with the generation, and a
    resumed run rebuilds the curriculum from the ledger to the same levels and bits."""
    curriculum = ["curriculum.window=1", "curriculum.raise_above=0.5", "curriculum.threshold=-1"]
    config = str(write_config(tmp_path))

    def levels(path: Path, run: str) -> list:
        with Ledger.open(str(path)) as led:
            return [led.generation(run, g).extra for g in (1, 2, 3)]

    with Ledger.open(str(tmp_path / "a.db")) as led:
        session.start(led, config, "a", curriculum, None)
    with Ledger.open(str(tmp_path / "b.db")) as led:
        session.start(led, config, "b", curriculum, 1)
        session.resume(led, "b", None)
    extra = levels(tmp_path / "a.db", "a")
    assert [e["level"] for e in extra] == [1, 2, 3]  # arithmetic's default level is 1
    assert all(e["success_rate"] == 1.0 for e in extra)
    assert [(e["curriculum"]["from_level"], e["curriculum"]["to_level"]) for e in extra] == [
        (1, 2), (2, 3), (3, 4)
    ]
    assert levels(tmp_path / "b.db", "b") == extra
    assert fingerprints(tmp_path / "b.db", "b") == fingerprints(tmp_path / "a.db", "a")
