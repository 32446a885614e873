"""What keeps a session's run consistent around its setup: a run name that belongs to one
model, the writer lease renewed while a model loads, a signal turned into an
`interrupted` run (or into nothing kept, when it came before the run existed), and a
fork's child deleted again when its setup fails. Used by engine.runtime.session and
engine.search.studystore."""

from __future__ import annotations

import re
import signal
import threading
from contextlib import contextmanager, suppress
from pathlib import Path

from seedledger.engine.runtime.console.interrupts import RunInterrupted, signal_of, signals_held
from seedledger.ledger import Ledger, RunInfo
from seedledger.ledger.errors import SeedLedgerError
from seedledger.ledger.lease import WriterLease

LEASE_TTL = 300.0  # seconds; the loop renews it after every member


def name_taken(run: RunInfo, model: str) -> str:
    """Why a new run of `model` cannot take `run`'s name, and what to do: `resume` only
    continues the same model (a quick look on `tiny` is not the real model's run)."""
    if run.base_model == model:
        return f"run {run.name!r} exists: `seedledger resume {run.name}` or pick another --run"
    return (f"run {run.name!r} exists and trains {run.base_model}, not {model}: pick another --run "
            f"(e.g. --run {run.name}-{re.sub(r'[^A-Za-z0-9_.-]+', '-', Path(model).name)})")


@contextmanager
def keepalive(lease: WriterLease, every: float = LEASE_TTL / 5):
    """Renew `lease` from a thread while setup (model load, replay of the history) runs:
    the loop renews it itself once it trains, but setup can outlast the lease's ttl."""
    stop = threading.Event()

    def beat() -> None:
        while not stop.wait(every):
            try:
                lease.heartbeat()
            except SeedLedgerError:  # taken over: the first commit will say so
                return

    thread = threading.Thread(target=beat, name="seedledger-lease", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()


@contextmanager
def interruptible(ledger: Ledger, run_name: str):
    """A SIGINT or SIGTERM (engine.runtime.console.interrupts) inside marks the run `interrupted`, records
    an `interrupted` event naming the signal and the last committed generation, and leaves
    as RunInterrupted. Used inside the writer lease, which is released after it."""
    try:
        yield
    except BaseException as exc:
        signum = signal_of(exc)
        if signum is None:
            raise
        name = signal.Signals(signum).name
        with signals_held():
            latest = ledger.latest_generation(run_name)
            ledger.set_status(run_name, "interrupted")
            ledger.log_event(run_name, "interrupted", {"signal": name, "generation": latest})
        raise RunInterrupted(
            f"interrupted by {name}: run {run_name} stopped at generation {latest}", signum, run_name
        ) from None


def not_started(exc: BaseException, what: str) -> None:
    """Re-raise an interrupt that came before a run was kept as RunInterrupted (no run)."""
    signum = signal_of(exc)
    if signum is not None:
        raise RunInterrupted(
            f"interrupted by {signal.Signals(signum).name} {what}; nothing was kept", signum
        ) from None


@contextmanager
def unkept(what: str):
    """An interrupt inside, before the run's row exists, leaves as RunInterrupted (no run)."""
    try:
        yield
    except BaseException as exc:
        not_started(exc, what)
        raise


@contextmanager
def rolled_back(ledger: Ledger, lease: WriterLease, run_name: str, what: str):
    """A failure inside, before anything trained, deletes the new run `run_name` again
    (its lease released first) so that its name stays free."""
    try:
        yield
    except BaseException as exc:
        with signals_held():
            lease.release()
            with suppress(Exception):
                ledger.delete_run(run_name)
        not_started(exc, what)
        raise
