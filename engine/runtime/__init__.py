"""The runtime: what a training session runs. `session` (train, resume, fork) settles a run
in `setup/`, loads its model from `models/`, scores members with `scoring/` replicas on
`backends/` in `pools/`, and runs `loop`, the ledger's one writer; `console/` is the
terminal's side and `loggers/` the trackers'; `hooks`, `failpoints` and `dirs` are small
helpers the rooms share. It imports neither the CLI, the Python API, search nor rebuild,
and each room imports only the rooms tests/test_layout.py lists for it.

The names below are the command line's one entry into the runtime (engine/cli imports
them from here, never from a room: tests/test_layout.py): start the demo's session,
resolve a model, score held-out rows, show progress, and the console's signal plumbing.
Each is looked up on first use (PEP 562), so `seedledger --help`, `log` and `show` start
without torch or transformers (issue 45 item 3).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from seedledger.engine.runtime.console.interrupts import RunInterrupted, sigterm_raises
    from seedledger.engine.runtime.console.progress import TrainingProgress
    from seedledger.engine.runtime.models.resolve import quiet_hf_env, resolve_model
    from seedledger.engine.runtime.scoring.evaluator import Evaluator, HeldOutScores
    from seedledger.engine.runtime.scoring.heldout import compare, mean_reward
    from seedledger.engine.runtime.session import start as start_session
    from seedledger.engine.runtime.setup.preflight import held_out_rows

_HERE = "seedledger.engine.runtime."
_WHERE: dict[str, tuple[str, str]] = {  # exported name -> (room module, its name there)
    "start_session": ("session", "start"),
    "resolve_model": ("models.resolve", "resolve_model"),
    "quiet_hf_env": ("models.resolve", "quiet_hf_env"),
    "held_out_rows": ("setup.preflight", "held_out_rows"),
    "Evaluator": ("scoring.evaluator", "Evaluator"),
    "HeldOutScores": ("scoring.evaluator", "HeldOutScores"),
    "compare": ("scoring.heldout", "compare"),
    "mean_reward": ("scoring.heldout", "mean_reward"),
    "TrainingProgress": ("console.progress", "TrainingProgress"),
    "RunInterrupted": ("console.interrupts", "RunInterrupted"),
    "sigterm_raises": ("console.interrupts", "sigterm_raises"),
}

__all__ = [
    "Evaluator", "HeldOutScores", "RunInterrupted", "TrainingProgress", "compare", "held_out_rows",
    "mean_reward", "quiet_hf_env", "resolve_model", "sigterm_raises", "start_session",
]


def __getattr__(name: str) -> Any:
    """An exported name, imported from its room on first use; anything else (a room or a
    module such as `session`) is AttributeError, so `from … import session` imports it."""
    where = _WHERE.get(name)
    if where is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    module, attr = where
    value = getattr(importlib.import_module(_HERE + module), attr)
    globals()[name] = value  # looked up once
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_WHERE))
