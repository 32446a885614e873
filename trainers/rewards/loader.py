"""Loading a user's reward function named in the config as ``module:function`` or
``path/to/file.py:function``.

This imports the user's own code (as a config names it), which is the point; model outputs
and datasets are never executed.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import sys
from pathlib import Path

from seedledger.ledger.errors import SeedLedgerError

from .combine import RewardFn


def module_name(path: str | Path) -> str:
    """The module name a reward file is imported under: stable across processes and runs
    (a digest of its resolved path; ``hash()`` of a str changes with every process)."""
    digest = hashlib.sha256(str(Path(path).resolve()).encode("utf-8")).hexdigest()[:16]
    return f"_seedledger_user_reward_{digest}"


def is_file_ref(target: str) -> bool:
    """Whether the part before ``:`` of a reward reference names a file (else a module)."""
    return target.endswith(".py") or "/" in target or "\\" in target


def load_reward_fn(ref: str, base_dir: str | Path | None = None) -> RewardFn:
    """Resolve ``ref`` to a callable; relative file paths are taken from ``base_dir``."""
    if not isinstance(ref, str) or ":" not in ref:
        raise SeedLedgerError(f"reward function {ref!r}: expected 'module:function' or 'file.py:function'")
    target, _, attr = ref.rpartition(":")
    if not target or not attr.isidentifier():
        raise SeedLedgerError(f"reward function {ref!r}: expected 'module:function' or 'file.py:function'")
    if is_file_ref(target):
        path = Path(target)
        if not path.is_absolute() and base_dir is not None:
            path = Path(base_dir) / path
        if not path.is_file():
            raise SeedLedgerError(f"reward function {ref!r}: no such file {path}")
        name = module_name(path)
        spec = importlib.util.spec_from_file_location(name, path)
        if spec is None or spec.loader is None:
            raise SeedLedgerError(f"reward function {ref!r}: cannot import {path}")
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        try:
            spec.loader.exec_module(module)
        except Exception as exc:
            sys.modules.pop(name, None)
            raise SeedLedgerError(
                f"reward function {ref!r}: importing {path} failed: {type(exc).__name__}: {exc}".splitlines()[0]
            ) from exc
    else:
        try:
            module = importlib.import_module(target)
        except Exception as exc:
            raise SeedLedgerError(
                f"reward function {ref!r}: cannot import module {target!r}: {type(exc).__name__}: {exc}".splitlines()[0]
            ) from exc
    fn = getattr(module, attr, None)
    if not callable(fn):
        raise SeedLedgerError(f"reward function {ref!r}: {target} has no function {attr!r}")
    return fn
