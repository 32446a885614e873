"""seedledger from Python: `import seedledger as sl`.

The functions below are engine.api's (the command line calls the same ones; docs/api.md);
every one takes `ledger=` (a path, an SQLAlchemy URL or an open `sl.Ledger`). Also here:
`sl.Ledger` (the SQL ledger itself), the records `sl.RunInfo` and `sl.GenerationRecord`,
and `sl.SeedLedgerError` (bad input, one line); `help()` each for its methods.

Names are looked up on first use (PEP 562), so that the console script, which imports this
package first, starts without the ledger's SQL stack or torch until a command needs them.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from seedledger.engine.api import (
        DEFAULT_LEDGER,
        attribute,
        evaluate,
        export,
        fork,
        history,
        history_frame,
        import_seeds,
        open_ledger,
        rebuild,
        rebuild_model,
        rebuild_to,
        resume,
        train,
        verify,
    )
    from seedledger.engine.evolve import evolve
    from seedledger.ledger import GenerationRecord as GenerationRecord
    from seedledger.ledger import Ledger as Ledger
    from seedledger.ledger import RunInfo as RunInfo
    from seedledger.ledger.errors import SeedLedgerError as SeedLedgerError

_API = "seedledger.engine.api"
_WHERE = {
    **dict.fromkeys(
        ("DEFAULT_LEDGER", "attribute", "evaluate", "export", "fork", "history", "history_frame", "import_seeds",
         "open_ledger", "rebuild", "rebuild_model", "rebuild_to", "resume", "train", "verify"),
        _API,
    ),
    "evolve": "seedledger.engine.evolve",
    "GenerationRecord": "seedledger.ledger", "Ledger": "seedledger.ledger", "RunInfo": "seedledger.ledger",
    "SeedLedgerError": "seedledger.ledger.errors",
    "__version__": "seedledger.engine",  # the installed distribution's
}

# what `help(seedledger)` documents: the functions (the classes' help is long: the module
# docstring names them)
__all__ = [
    "DEFAULT_LEDGER", "attribute", "evaluate", "evolve", "export", "fork", "history", "history_frame", "import_seeds",
    "open_ledger", "rebuild", "rebuild_model", "rebuild_to", "resume", "train", "verify",
]


def __getattr__(name: str) -> Any:
    where = _WHERE.get(name)
    if where is None:
        raise AttributeError(f"module 'seedledger' has no attribute {name!r}")
    value = getattr(importlib.import_module(where), name)
    globals()[name] = value  # looked up once
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_WHERE))
