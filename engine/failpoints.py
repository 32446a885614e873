"""Fault injection for crash tests: a real SIGKILL at a named point of the loop.

`SEEDLEDGER_FAILPOINT=name@generation` kills this process with SIGKILL when it reaches
`name` in that generation. `name@generation+SECONDS` instead starts a timer there that
kills the process SECONDS later, wherever it then is: a few milliseconds after `update`
or `commit` that is usually inside replay's update or the ledger's transaction, which no
named point can reach (replay and ledger do not import engine). Unset (always, outside
tests) a failpoint costs one dict lookup.

Points, in the order a generation meets them:
    member      after each member is scored (engine/loop.py; once per member)
    evaluated   every member scored, nothing computed from the rewards yet
    update      the pool's apply, before replay's update (engine/pools/local.py)
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


def failpoint(name: str, generation: int) -> None:
    spec = os.environ.get("SEEDLEDGER_FAILPOINT")
    if not spec:
        return
    point, _, delay = spec.partition("+")
    if point != f"{name}@{generation}":
        return
    if not delay:
        _kill()
    timer = threading.Timer(float(delay), _kill)
    timer.daemon = True
    timer.start()
