"""The generation loop end to end on the `tiny` model: determinism, resume, fork, crashes.

Real ledgers on disk, the real HF backend, real subprocesses killed with SIGKILL: at every
phase of a generation (engine/runtime/failpoints.py), and at seeded random moments.
"""

from __future__ import annotations

import json
import os
import random
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from seedledger.engine.runtime import session
from seedledger.engine.runtime.hooks import Hooks
from seedledger.ledger import Ledger
from tests.support.runs import ROOT, fingerprints
from tests.support.runs import cli as seedledger

# The reward names a module: this test's own code, so its resumes and forks pass
# --trust-code (trust_code=True), as a user resuming their own run does.
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
    assert "previous_commit" not in records[0].timings  # a record cannot time its own commit
    assert all(0.0 < rec.timings["previous_commit"] < 60.0 for rec in records[1:])
    for rec in records:
        assert any(m.coefficient != 0.0 for m in rec.members)
        assert set(rec.members[0].components) == {"arithmetic", "tests.support.rewards:vowel_share"}
        assert rec.batch_indices and len(rec.batch_indices) == TINY["batch_size"]
    from seedledger.engine.rebuild.rebuilding import verify_ref

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
        session.resume(led, "r", None, trust_code=True)  # the config says 3: two more
        with pytest.raises(Exception, match="exists"):
            session.start(led, str(write_config(tmp_path)), "r", [], 1)
        again = session.resume(led, "r", None, trust_code=True)  # finished: nothing to add, same answer
        assert (again.records, again.latest_generation, again.fingerprint) == ([], 3, fps[-1])
        assert led.get_run("r").status == "finished"
    assert fingerprints(path, "r") == fps


def test_fork_shares_the_prefix_and_diverges(reference, tmp_path):
    ledger_path, fps = reference
    with Ledger.open(str(ledger_path)) as led:
        session.fork(led, "ref@1", "child", ["lr=0.1"], 2, trust_code=True)
        child = [led.generation("child", g).fingerprint for g in (1, 2, 3)]
        assert led.get_run("child").parent == ("ref", 1)
        assert led.latest_generation("child") == 3
        with pytest.raises(Exception, match="latest generation is ref@3"):
            session.fork(led, "ref@9", "child2", [], 1, trust_code=True)
    assert child[0] == fps[0]
    assert child[1] != fps[1]


def test_failpoints_kill_at_once_or_after_a_delay_and_only_where_named():
    """The child says when the failpoint returned and when its work (a long sleep) ended:
    an immediate kill leaves neither line, a delayed one the first alone. No wall-clock
    threshold: a loaded machine changes nothing here."""
    code = ("import sys, time; from seedledger.engine.runtime.failpoints import failpoint; failpoint('x', 1); "
            "print('returned', flush=True); time.sleep(float(sys.argv[1])); print('finished', flush=True)")

    def run(spec: str, work: float) -> tuple[int, list[str]]:
        env = os.environ | {"SEEDLEDGER_FAILPOINT": spec}
        proc = subprocess.run([sys.executable, "-c", code, str(work)], cwd=ROOT, env=env, capture_output=True,
                              text=True, timeout=300)
        return proc.returncode, proc.stdout.split()

    assert run("x@2", 0) == (0, ["returned", "finished"])  # another generation: no kill
    assert run("x@1", 0) == (-signal.SIGKILL, [])  # at once: the failpoint never returned
    assert run("x@1+0.5", 60) == (-signal.SIGKILL, ["returned"])  # after a delay, during the work


def committed_indices(ledger_path: Path, run: str) -> list[int]:
    """Every generation row of `run`, straight from SQL: a duplicate would show twice."""
    con = sqlite3.connect(ledger_path)
    try:
        rows = con.execute(
            "SELECT g.idx FROM generations g JOIN runs r ON r.id = g.run_id WHERE r.name = ? "
            "ORDER BY g.idx",
            (run,),
        ).fetchall()
    finally:
        con.close()
    return [idx for (idx,) in rows]


def assert_whole_prefix(ledger_path: Path, run: str, fps: list[str]) -> int:
    """What is committed is generations 1..n, each once, each at the uninterrupted bits."""
    done = fingerprints(ledger_path, run)
    assert committed_indices(ledger_path, run) == list(range(1, len(done) + 1))
    assert done == fps[: len(done)], "what was committed before the crash is whole and exact"
    return len(done)


# (failpoint, what the kill leaves of the generation in flight). `+SECONDS` arms a timer
# at the point, so the SIGKILL lands a moment later: inside replay's update, inside the
# ledger's commit transaction (or just after either; hence "either").
PHASES = [
    ("member", "lost"),  # during evaluation
    ("update+0.002", "lost"),  # during the update: replay's update, then the fingerprint
    ("updated", "lost"),  # the update applied in memory, the record not committed
    ("commit+0.002", "either"),  # during the commit: the generation is whole or absent
    ("committed", "kept"),  # just after the commit
]


@pytest.mark.slow
def test_sigkill_in_every_phase_then_resume_reaches_the_same_bits(reference, tmp_path):
    """One run killed in turn during evaluation, during the update, after it, during the
    commit and after it, each time resumed; the generation in flight is lost or kept
    whole, never half, and the last resume ends at the uninterrupted fingerprints."""
    _, fps = reference
    ledger_path = tmp_path / "crash.db"
    cmd = ["train", str(write_config(tmp_path)), "--run", "c", "--ledger", str(ledger_path), "--json"]
    latest = 0
    for point, outcome in PHASES:
        name, plus, delay = point.partition("+")
        generation = latest + 1
        env = os.environ | {"SEEDLEDGER_FAILPOINT": f"{name}@{generation}{plus}{delay}"}
        proc = seedledger(*cmd, env=env, check=False)
        assert proc.returncode == -signal.SIGKILL, (point, proc.stderr[-2000:])
        latest = assert_whole_prefix(ledger_path, "c", fps)
        allowed = {"lost": [generation - 1], "kept": [generation], "either": [generation - 1, generation]}
        assert latest in allowed[outcome], (point, generation, latest)
        cmd = ["resume", "c", "--ledger", str(ledger_path), "--json", "--trust-code"]
    payload = json.loads(seedledger(*cmd).stdout)
    assert payload["latest_generation"] == 3
    assert committed_indices(ledger_path, "c") == [1, 2, 3]
    assert fingerprints(ledger_path, "c") == fps


def lease_pid(ledger_path: Path) -> int | None:
    """The pid holding the run's writer lease, read without disturbing the writer (WAL)."""
    if not ledger_path.exists():
        return None
    con = sqlite3.connect(ledger_path, timeout=5.0)
    try:
        row = con.execute("SELECT pid FROM leases").fetchone()
    except sqlite3.OperationalError:  # schema not created yet
        return None
    finally:
        con.close()
    return row[0] if row else None


def wait_for_loop(proc: subprocess.Popen, ledger_path: Path, timeout: float = 300.0) -> None:
    """Until `proc` holds the writer lease: it has loaded the model and entered the loop."""
    deadline = time.monotonic() + timeout
    while lease_pid(ledger_path) != proc.pid:
        assert proc.poll() is None, f"exited {proc.returncode} before training"
        assert time.monotonic() < deadline, "no lease taken"
        time.sleep(0.02)


KILLS = 5
GENERATIONS = 6


@pytest.fixture(scope="module")
def reference_long(tmp_path_factory, reference) -> tuple[list[str], float]:
    """An uninterrupted GENERATIONS-generation run: its fingerprints and the seconds one
    generation takes here (the clock the random kill times are drawn against)."""
    tmp = tmp_path_factory.mktemp("reference-long")
    seconds: list[float] = []
    hooks = Hooks(on_generation_end=lambda record, took: seconds.append(took))
    with Ledger.open(str(tmp / "long.db")) as led:
        session.start(led, str(write_config(tmp, generations=GENERATIONS)), "long", [], None, hooks)
    fps = fingerprints(tmp / "long.db", "long")
    assert len(fps) == GENERATIONS and fps[:3] == reference[1]
    return fps, sorted(seconds)[len(seconds) // 2]


@pytest.mark.slow
def test_sigkill_at_seeded_random_moments_then_resume(reference_long, tmp_path):
    """KILLS SIGKILLs at moments drawn from random.Random(1234), each followed by `resume`.

    A kill time is drawn over the rest of the run, measured from when the victim takes the
    writer lease (after the ~10 s of imports and model loading, which no kill needs to
    test), in units of the generation time measured on this machine; so kills land in
    evaluation, the update and the commit in proportion to the time each takes. A kill
    that comes after the run finished does not count: the attempt starts again on a fresh
    ledger with the times halved, so a fast machine cannot make the test pass vacuously."""
    fps, per_generation = reference_long
    rng = random.Random(1234)
    scale = 0.8
    log = []
    for attempt in range(4):
        ledger_path = tmp_path / f"random-{attempt}.db"
        config = str(write_config(tmp_path, generations=GENERATIONS))
        cmd = ["train", config, "--run", "c", "--ledger", str(ledger_path), "--json"]
        landed, latest = 0, 0
        while landed < KILLS:
            proc = subprocess.Popen(
                [sys.executable, "-m", "seedledger.engine.cli", *cmd], cwd=ROOT,
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            )
            cmd = ["resume", "c", "--ledger", str(ledger_path), "--json", "--trust-code"]
            try:
                wait_for_loop(proc, ledger_path)
                delay = rng.uniform(0.0, scale * (GENERATIONS - latest) * per_generation)
                try:
                    proc.wait(timeout=delay)
                except subprocess.TimeoutExpired:
                    proc.send_signal(signal.SIGKILL)
                    proc.wait()
            finally:
                if proc.poll() is None:
                    proc.kill()
                    proc.wait()
            before, latest = latest, assert_whole_prefix(ledger_path, "c", fps)
            if proc.returncode != -signal.SIGKILL or latest == GENERATIONS:
                break  # the run finished before the kill: a miss
            landed += 1
            log.append(f"kill {landed}: {delay:.2f} s into the loop, generations {before} -> {latest}")
        if landed == KILLS:
            break
        log.append(f"attempt {attempt}: the run finished after {landed} kills; halving the times")
        scale /= 2
    assert landed >= 5, "\n".join(log)
    payload = json.loads(seedledger(*cmd).stdout)
    assert payload["latest_generation"] == GENERATIONS, "\n".join(log)
    assert committed_indices(ledger_path, "c") == list(range(1, GENERATIONS + 1))
    assert fingerprints(ledger_path, "c") == fps, "\n".join(log)
    print("\n".join(log))  # where the kills landed (pytest -s)


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
        session.resume(led, "b", None, trust_code=True)
    extra = levels(tmp_path / "a.db", "a")
    assert [e["level"] for e in extra] == [1, 2, 3]  # arithmetic's default level is 1
    assert all(e["success_rate"] == 1.0 for e in extra)
    assert [(e["curriculum"]["from_level"], e["curriculum"]["to_level"]) for e in extra] == [
        (1, 2), (2, 3), (3, 4)
    ]
    assert levels(tmp_path / "b.db", "b") == extra
    assert fingerprints(tmp_path / "b.db", "b") == fingerprints(tmp_path / "a.db", "a")
