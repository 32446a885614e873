"""SIGINT and SIGTERM stop a training session the same way.

Python turns SIGINT into KeyboardInterrupt in the main thread; `sigterm_raises` makes
SIGTERM raise `Terminated` there too, so `kill PID`, a scheduler's stop or a container
shutdown end a session as Ctrl-C does: the session (engine.runtime.session) marks the run
`interrupted`, records an `interrupted` event, releases the writer lease and raises
`RunInterrupted`, which the CLI prints as one line with the `resume` command and turns
into exit 130 (SIGINT) or 143 (SIGTERM), the shell's 128 + signal number.
"""

from __future__ import annotations

import signal
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager

from seedledger.ledger.errors import SeedLedgerError


class Terminated(BaseException):
    """SIGTERM as an exception in the main thread (KeyboardInterrupt is SIGINT's)."""


class RunInterrupted(SeedLedgerError):
    """A session stopped by a signal; `run` names the run left to resume (None when the
    interrupt came before anything was kept). Exit code 128 + the signal number."""

    def __init__(self, message: str, signum: int, run: str | None = None):
        super().__init__(message)
        self.exit_code = 128 + signum
        self.run = run


def signal_of(exc: BaseException) -> int | None:
    """The signal behind an interrupt exception, else None."""
    if isinstance(exc, Terminated):
        return signal.SIGTERM
    if isinstance(exc, KeyboardInterrupt):
        return signal.SIGINT
    return None


_pending: int | None = None  # the signal received inside `sigterm_raises`, until it leaves


def _interrupt(signum: int) -> BaseException:
    return Terminated() if signum == signal.SIGTERM else KeyboardInterrupt()


def _raise(signum, frame) -> None:
    global _pending
    _pending = signum
    raise _interrupt(signum)


def raise_pending() -> None:
    """Raise again a signal whose exception was swallowed: a handler's exception raised
    inside a finalizer (`__del__`, e.g. llvmlite's during numba's JIT) is printed and
    dropped by Python, so the training loop calls this at safe points to stop anyway."""
    if _pending is not None:
        raise _interrupt(_pending)


@contextmanager
def sigterm_raises() -> Iterator[None]:
    """While inside, SIGINT and SIGTERM raise KeyboardInterrupt / Terminated in the main
    thread (elsewhere: a no-op), and are remembered for `raise_pending`."""
    global _pending
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    old = {s: signal.signal(s, _raise) for s in (signal.SIGINT, signal.SIGTERM)}
    hook = sys.unraisablehook

    def unraisable(info) -> None:  # our own interrupt, dropped by a finalizer: raise_pending has it
        if not isinstance(info.exc_value, KeyboardInterrupt | Terminated):
            hook(info)

    sys.unraisablehook = unraisable
    try:
        yield
    finally:
        for s, handler in old.items():
            signal.signal(s, handler)
        sys.unraisablehook = hook
        _pending = None


@contextmanager
def signals_held() -> Iterator[None]:
    """Ignore SIGINT and SIGTERM while inside: the few statements that record an interrupt
    must not be cut short by a second Ctrl-C."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    old = {s: signal.signal(s, signal.SIG_IGN) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for s, handler in old.items():
            signal.signal(s, handler)
