"""Experiment-tracker mirrors (`report_to: [tensorboard, mlflow, wandb]`).

The ledger is the source of truth; these only copy each generation's metrics to the
dashboards people already use. So a tracker that fails mid-run is warned about once and
dropped, never allowed to stop training; one that cannot start fails before any compute
is spent, with a one-line `SeedLedgerError`.
"""

from __future__ import annotations

import contextlib
import importlib
import warnings
from collections.abc import Iterable
from pathlib import Path
from typing import Any, Protocol

from seedledger.ledger.errors import SeedLedgerError
from seedledger.ledger.extras import ensure, require

# name -> (module in this package, class, library it needs: ledger.extras names its extra)
_REGISTRY: dict[str, tuple[str, str, str]] = {
    "tensorboard": ("._tensorboard", "TensorBoardLogger", "tensorboard"),
    "mlflow": ("._mlflow", "MLflowLogger", "mlflow"),
    "wandb": ("._wandb", "WandbLogger", "wandb"),
}
KNOWN = tuple(_REGISTRY)


class Logger(Protocol):
    """One tracker: writes the config at construction, then one call per generation."""

    def log_generation(self, generation: int, metrics: dict[str, float]) -> None: ...

    def close(self) -> None: ...


class MultiLogger:
    """Fans out to every selected tracker; a tracker that raises is warned about once
    and disabled, because a dashboard outage must not cost a training run."""

    def __init__(self, loggers: dict[str, Logger]) -> None:
        self.loggers = dict(loggers)

    @property
    def names(self) -> list[str]:
        return list(self.loggers)

    def log_generation(self, generation: int, metrics: dict[str, float]) -> None:
        clean = _numeric(metrics)
        for name in list(self.loggers):
            self._guard(name, "log_generation", generation, clean)

    def close(self) -> None:
        for name in list(self.loggers):
            self._guard(name, "close")
        self.loggers.clear()

    def __enter__(self) -> MultiLogger:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _guard(self, name: str, method: str, *args: Any) -> None:
        logger = self.loggers[name]
        try:
            getattr(logger, method)(*args)
        except Exception as exc:  # any tracker failure is non-fatal, by design
            del self.loggers[name]
            if method != "close":
                with contextlib.suppress(Exception):  # free its files and threads if it can
                    logger.close()
            warnings.warn(
                f"{name} logger failed and is disabled for this run "
                f"(the ledger still records everything): {type(exc).__name__}: {exc}",
                RuntimeWarning,
                stacklevel=3,
            )


def _numeric(metrics: dict[str, Any]) -> dict[str, float]:
    """Drop what no tracker can plot (None, text) here, so an odd metric never reaches
    a tracker, let alone the training loop."""
    out: dict[str, float] = {}
    for key, value in metrics.items():
        try:
            out[str(key)] = float(value)
        except (TypeError, ValueError):
            continue
    return out


def normalize(report_to: str | Iterable[str] | None) -> list[str]:
    """Config value -> ordered unique names; `none`/empty means no trackers."""
    if report_to is None:
        return []
    items = [report_to] if isinstance(report_to, str) else list(report_to)
    names: list[str] = []
    for item in items:
        name = str(item).strip().lower()
        if name in ("", "none") or name in names:
            continue
        if name not in _REGISTRY:
            raise SeedLedgerError(
                f"unknown report_to entry {item!r}; choose from {', '.join(KNOWN)} or none"
            )
        names.append(name)
    return names


def make_loggers(
    report_to: str | Iterable[str] | None,
    run_name: str,
    log_dir: Path,
    config: dict[str, Any],
) -> MultiLogger:
    """Start every tracker named in `report_to`, each writing under `log_dir`."""
    names = normalize(report_to)
    started: dict[str, Logger] = {}
    try:
        for name in names:
            started[name] = _start(name, run_name, Path(log_dir), config)
    except BaseException:
        MultiLogger(started).close()
        raise
    return MultiLogger(started)


def check(report_to: str | Iterable[str] | None) -> None:
    """Every tracker named is known and its library installed (found, not imported): a
    one-line error before the run is created (engine.runtime.setup.preflight), not a run left behind."""
    for name in normalize(report_to):
        ensure(_REGISTRY[name][2], f"report_to {name}")


def _start(name: str, run_name: str, log_dir: Path, config: dict[str, Any]) -> Logger:
    module, cls, lib = _REGISTRY[name]
    require(lib, f"report_to {name}")
    factory = getattr(importlib.import_module(module, __name__), cls)
    log_dir.mkdir(parents=True, exist_ok=True)
    try:
        return factory(run_name, log_dir, config)
    except Exception as exc:
        raise SeedLedgerError(
            f"{name} logger could not start: {type(exc).__name__}: {exc}".splitlines()[0]
        ) from exc


__all__ = ["KNOWN", "Logger", "MultiLogger", "check", "make_loggers", "normalize"]
