"""Training sessions: open the ledger, provision the model, hold the lease, run the loop.

`train`, `resume` and `fork` differ only in how the run and its starting generation are
found; everything after that is the same loop. `--generations N` says how many to train
in this session; the config's `generations` is the run's target (schedules are laid out
over it), which `resume` and `fork` continue towards by default.
"""

from __future__ import annotations

import os
import platform
import socket
from dataclasses import dataclass
from pathlib import Path

from engine.config import TrainConfig, apply_overrides, load_config, validate
from engine.loop import Hooks, train
from engine.models import model_revision, resolve_model
from engine.pools import make_pool
from engine.refs import resolve_ref
from ledger import GenerationRecord, Ledger, RunInfo
from ledger.db import sqlite_path, to_url
from ledger.errors import RunNotFound, SeedLedgerError
from replay.noise import NOISE_SPEC, run_key

LEASE_TTL = 300.0  # seconds; the loop renews it after every member


@dataclass
class SessionResult:
    run: RunInfo
    records: list[GenerationRecord]  # committed by this session (none when already done)
    fingerprint: str  # of the master at `latest_generation`
    latest_generation: int


def anchors_dir(ledger: Ledger) -> Path:
    """Anchors live next to a SQLite ledger, else under $SEEDLEDGER_HOME."""
    path = sqlite_path(to_url(ledger.location))
    if path is not None:
        return Path(str(path) + ".anchors")
    home = Path(os.environ.get("SEEDLEDGER_HOME", Path.home() / ".cache" / "seedledger"))
    return home / "anchors"


def software_versions() -> dict[str, str]:
    from importlib.metadata import version

    import torch
    import transformers

    return {
        "seedledger": version("seedledger") if _installed("seedledger") else "dev",
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "python": platform.python_version(),
    }


def _installed(dist: str) -> bool:
    from importlib.metadata import PackageNotFoundError, version

    try:
        version(dist)
    except PackageNotFoundError:
        return False
    return True


def _run_loop(ledger: Ledger, run: RunInfo, cfg: TrainConfig, pool, generations: int, hooks):
    loggers = None
    if cfg.report_to:
        from engine.loggers import make_loggers

        loggers = make_loggers(cfg.report_to, run.name, anchors_dir(ledger).parent / "logs", cfg.model_dump())
    try:
        with ledger.lease(run.name, ttl=LEASE_TTL) as lease:
            ledger.set_status(run.name, "training")
            try:
                records = train(
                    ledger, run, cfg, pool, generations,
                    anchors_dir=anchors_dir(ledger), loggers=loggers, hooks=hooks,
                    heartbeat=lease.heartbeat,
                )
            except BaseException:
                ledger.set_status(run.name, "interrupted")
                raise
            latest = ledger.latest_generation(run.name)
            done = latest - run.parent_generation
            ledger.set_status(run.name, "finished" if done >= cfg.generations else "stopped")
    finally:
        if loggers is not None:
            loggers.close()
    master, _ = pool.state()
    from replay.fingerprint import fingerprint

    return SessionResult(run, records, fingerprint(master), latest)


def start(
    ledger: Ledger,
    config_path: str | None,
    run_name: str | None,
    overrides: list[str],
    generations: int | None,
    hooks: Hooks | None = None,
) -> SessionResult:
    cfg = load_config(config_path, overrides)
    name = run_name or (Path(config_path).stem if config_path else "run")
    if _has_run(ledger, name):
        raise SeedLedgerError(f"run {name!r} exists: `seedledger resume {name}` or pick another --run")
    model_dir = resolve_model(cfg.model)
    pool = make_pool(cfg, model_dir)
    try:
        run = ledger.create_run(
            name=name,
            base_model=cfg.model,
            base_revision=model_revision(cfg.model),
            base_fingerprint=pool.base_fingerprint(),
            noise_spec=NOISE_SPEC,
            dtype_policy=f"fp32-master/{cfg.dtype}-eval",
            param_selection="all",
            config=cfg.model_dump(mode="json"),
            seed=cfg.seed,
            run_key=run_key(cfg.seed),
            parent=None,
            software=software_versions(),
            host=socket.gethostname(),
        )
        pool.restore(ledger, run.name, 0, None)
        count = cfg.generations if generations is None else generations
        return _run_loop(ledger, run, cfg, pool, count, hooks)
    finally:
        pool.close()


def resume(ledger: Ledger, run_name: str, generations: int | None, hooks: Hooks | None = None):
    run = ledger.get_run(run_name)
    cfg = validate(run.config, f"run {run_name} config")
    latest = ledger.latest_generation(run_name)
    if generations is None:
        generations = max(cfg.generations - (latest - run.parent_generation), 0)
    pool = make_pool(cfg, resolve_model(cfg.model))
    try:
        _check_base(run, pool.base_fingerprint())
        pool.restore(ledger, run.name, latest, anchors_dir(ledger))
        ledger.log_event(run.name, "resume", {"from_generation": latest, "generations": generations})
        return _run_loop(ledger, run, cfg, pool, generations, hooks)
    finally:
        pool.close()


def fork(
    ledger: Ledger,
    ref: str,
    new_name: str,
    overrides: list[str],
    generations: int | None,
    hooks: Hooks | None = None,
) -> SessionResult:
    parent, gen = resolve_ref(ledger, ref)
    data = apply_overrides(dict(parent.config), list(overrides))
    cfg = validate(data, "fork config")
    if cfg.model != parent.base_model:
        raise SeedLedgerError("a fork keeps its parent's base model; `model` cannot be changed")
    if _has_run(ledger, new_name):
        raise SeedLedgerError(f"run {new_name!r} exists; pick another --run")
    pool = make_pool(cfg, resolve_model(cfg.model))
    try:
        _check_base(parent, pool.base_fingerprint())
        run = ledger.create_run(
            name=new_name,
            base_model=parent.base_model,
            base_revision=parent.base_revision,
            base_fingerprint=parent.base_fingerprint,
            noise_spec=parent.noise_spec,
            dtype_policy=f"fp32-master/{cfg.dtype}-eval",
            param_selection=parent.param_selection,
            config=cfg.model_dump(mode="json"),
            seed=cfg.seed,
            run_key=run_key(cfg.seed),
            parent=(parent.name, gen),
            software=software_versions(),
            host=socket.gethostname(),
        )
        pool.restore(ledger, run.name, gen, anchors_dir(ledger))
        count = max(cfg.generations - gen, 0) if generations is None else generations
        return _run_loop(ledger, run, cfg, pool, count, hooks)
    finally:
        pool.close()


def _has_run(ledger: Ledger, name: str) -> bool:
    try:
        ledger.get_run(name)
    except RunNotFound:
        return False
    return True


def _check_base(run: RunInfo, fingerprint: str) -> None:
    if run.base_fingerprint and run.base_fingerprint != fingerprint:
        raise SeedLedgerError(
            f"base model {run.base_model!r} has fingerprint {fingerprint[:16]}…, but run "
            f"{run.name} was trained from {run.base_fingerprint[:16]}…: not the same weights"
        )
