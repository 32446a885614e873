"""Writer lease with real processes: one winner in a race, takeover of dead or expired holders;
on SQLite and PostgreSQL."""

from __future__ import annotations

import multiprocessing as mp
import os
import time

import pytest
from test_ledger_kit import new_run, record

from seedledger.ledger import LeaseHeld, Ledger

FORK = mp.get_context("fork")


def _racer(path, barrier, results, release) -> None:
    led = Ledger.open(path)
    barrier.wait()
    try:
        lease = led.lease("r", holder=f"racer-{os.getpid()}").acquire()
    except LeaseHeld as exc:
        results.put(("held", str(exc)))
        return
    results.put(("won", ""))
    release.wait(10)
    lease.release()


def test_two_processes_race_one_wins(ledger_url):
    path = ledger_url
    with Ledger.open(path) as led:
        new_run(led, "r")
    for _ in range(4):
        barrier, results, release = FORK.Barrier(2), FORK.Queue(), FORK.Event()
        procs = [FORK.Process(target=_racer, args=(path, barrier, results, release)) for _ in "ab"]
        for p in procs:
            p.start()
        outcomes = sorted([results.get(timeout=30), results.get(timeout=30)])
        release.set()
        for p in procs:
            p.join(10)
        assert [o[0] for o in outcomes] == ["held", "won"]
        assert "is being written by racer-" in outcomes[0][1] and "pid" in outcomes[0][1]
    with Ledger.open(path) as led:
        kinds = [e.kind for e in led.events("r")]
    assert kinds.count("lease-acquired") == 4 and kinds.count("lease-released") == 4


def _hold_and_die(path) -> None:
    led = Ledger.open(path)
    led.lease("r").acquire()
    os.kill(os.getpid(), 9)


def test_dead_holder_taken_over(ledger_url):
    path = ledger_url
    with Ledger.open(path) as led:
        new_run(led, "r")
    p = FORK.Process(target=_hold_and_die, args=(path,))
    p.start()
    p.join(30)
    assert p.exitcode == -9
    with Ledger.open(path) as led:
        with led.lease("r"):
            led.commit_generation("r", record(1))
        ev = led.events("r", "lease-takeover")[0].payload
    assert ev["reason"] == f"holder pid {p.pid} is dead" and ev["previous"]["pid"] == p.pid


def test_expired_heartbeat_taken_over_and_old_holder_stops(ledger_url):
    path = ledger_url
    with Ledger.open(path) as a, Ledger.open(path) as b:
        new_run(a, "r")
        old = a.lease("r", holder="old", ttl=0.05).acquire()
        time.sleep(0.1)
        with b.lease("r", holder="new"):
            with pytest.raises(LeaseHeld, match="taken over"):
                old.heartbeat()
            with pytest.raises(LeaseHeld):
                a.commit_generation("r", record(1))
            b.commit_generation("r", record(1))
        assert b.events("r", "lease-takeover")[0].payload["reason"] == "heartbeat expired"


def test_heartbeat_extends(ledger_url):
    with Ledger.open(ledger_url) as led:
        new_run(led, "r")
        with led.lease("r", ttl=0.3) as lease:
            for _ in range(4):
                time.sleep(0.1)
                lease.heartbeat()
            with pytest.raises(LeaseHeld):  # still live: nobody may take it
                led.lease("r", holder="other").acquire()
