"""Fault injection for crash tests: a real SIGKILL at a named point of the loop.

`SEEDLEDGER_FAILPOINT=name@generation` kills this process with SIGKILL when the loop
reaches `name` in that generation. Unset (always, outside tests) it costs one dict lookup.
"""

from __future__ import annotations

import os
import signal


def failpoint(name: str, generation: int) -> None:
    spec = os.environ.get("SEEDLEDGER_FAILPOINT")
    if spec and spec == f"{name}@{generation}":
        os.kill(os.getpid(), signal.SIGKILL)
