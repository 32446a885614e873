"""Fault injection for crash tests: a real SIGKILL at a named point of the loop.

`SEEDLEDGER_FAILPOINT=name@generation` kills this process with SIGKILL when it reaches
`name` in that generation. `name@generation:fill=PATH` instead fills the filesystem that
holds PATH (a file it creates) until it is full, and carries on: the next write fails
with ENOSPC (disk-full tests, on a small filesystem). `name@generation+SECONDS` instead starts a timer there that
kills the process SECONDS later, wherever it then is: a few milliseconds after `update`
or `commit` that is usually inside replay's update or the ledger's transaction, which no
named point can reach (replay and ledger do not import engine). Unset (always, outside
tests) a failpoint costs one dict lookup.

Points, in the order a generation meets them:
    member      after each member is scored (engine/runtime/loop.py; once per member)
    evaluated   every member scored, nothing computed from the rewards yet
    update      the pool's apply, before replay's update (engine/runtime/pools/local.py)
    updated     the pool's apply, after replay's update and the fingerprint
    applied     the loop has the fingerprint; the record is not committed
    commit      just before the ledger's commit of the generation
    committed   just after it
"""

from __future__ import annotations

import os
import signal
import threading


def _kill() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


def _fill(path: str) -> None:
    """Write zeros to `path` until the filesystem has no space left."""
    chunk = bytes(1 << 16)
    with open(path, "wb", buffering=0) as fh:
        try:
            while True:
                fh.write(chunk)
        except OSError:
            pass
        try:
            while True:  # the last partial chunk's worth
                fh.write(b"\0")
        except OSError:
            pass


def failpoint(name: str, generation: int) -> None:
    spec = os.environ.get("SEEDLEDGER_FAILPOINT")
    if not spec:
        return
    spec, _, fill = spec.partition(":fill=")
    if fill:
        if spec == f"{name}@{generation}":
            _fill(fill)
        return
    point, _, delay = spec.partition("+")
    if point != f"{name}@{generation}":
        return
    if not delay:
        _kill()
    timer = threading.Timer(float(delay), _kill)
    timer.daemon = True
    timer.start()
