"""seedledger from Python: `import seedledger as sl`.

The functions are engine.api's (the command line calls the same ones); see its docstring
for how ledgers and references are named.
"""

from seedledger.engine.api import (
    DEFAULT_LEDGER,
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
from seedledger.ledger import GenerationRecord, Ledger, RunInfo
from seedledger.ledger.errors import SeedLedgerError

__all__ = [
    "DEFAULT_LEDGER", "GenerationRecord", "Ledger", "RunInfo", "SeedLedgerError", "evaluate", "evolve", "export", "fork",
    "history", "history_frame", "import_seeds", "open_ledger", "rebuild", "rebuild_model", "rebuild_to",
    "resume", "train", "verify",
]
