"""What `train`, `resume` and `fork` differ in, as data: each reads its config from its
own source, takes the refusals that need no model, and returns a `Plan`;
engine.runtime.session runs every plan down one path. Also the row a new run is created
with (`run_spec`), shared by `train` (a new lineage) and `fork` (a child)."""

from __future__ import annotations

import os
import platform
import socket
from dataclasses import dataclass, replace
from pathlib import Path

from seedledger.engine.config import TrainConfig, apply_overrides, load_config, validate
from seedledger.engine.refs import resolve_ref
from seedledger.engine.runtime.models.resolve import model_revision
from seedledger.engine.runtime.setup import forkcheck
from seedledger.engine.runtime.setup.devices import check_device
from seedledger.engine.runtime.setup.guards import name_taken
from seedledger.engine.runtime.setup.stored_code import check_stored_code, stored_code
from seedledger.ledger import Ledger, RunInfo, RunSpec
from seedledger.ledger.errors import SeedLedgerError
from seedledger.ledger.names import check_run_name
from seedledger.replay.noise import run_key


@dataclass(frozen=True)
class Plan:
    """One session's inputs. `run` is the row when it exists (resume: leased before anything
    loads), else the session creates `name` (a child of `parent` when a fork)."""

    session: str  # "train", "resume" or "fork": how its inputs are recorded
    name: str  # the run it trains
    cfg: TrainConfig  # validated, its device checked; backend and sizes not yet chosen
    generations: int | None  # how many to train; None: on to the config's target
    run: RunInfo | None = None
    parent: RunInfo | None = None  # a fork's parent: the child's spec and base
    at: int = 0  # the generation restored (a resume's is its latest, read under the lease)
    regroup: bool = False  # a fork that changed a forward group's rows chooses its size again
    take_over: bool = False
    accept_changed_inputs: bool = False

    @property
    def continues(self) -> RunInfo | None:
        """The row whose history this session continues: its inputs are compared, its base
        checked (None for a new lineage, whose row records the pool's own base)."""
        return self.parent or self.run


def for_start(ledger: Ledger, config: str | os.PathLike[str] | dict | None, run_name: str | None,
              overrides: list[str], generations: int | None) -> Plan:
    """A new run from a YAML file, a dict of config keys, or the defaults (None)."""
    if isinstance(config, dict):
        cfg = validate(apply_overrides(dict(config), overrides), "config", overrides=overrides)
        name = check_run_name(run_name or "run")
    else:
        cfg = load_config(config, overrides)
        name = check_run_name(run_name or (Path(config).stem if config else "run"))
    check_device(cfg.device)
    if ledger.has_run(name):
        raise SeedLedgerError(name_taken(ledger.get_run(name), cfg.model))
    return Plan("train", name, cfg, generations)


def for_resume(ledger: Ledger, run_name: str, generations: int | None, take_over: bool, trust_code: bool,
               accept_changed_inputs: bool) -> Plan:
    """The run as stored; its reward code is imported only with `trust_code`."""
    run = ledger.get_run(run_name)
    check_stored_code(stored_code(run.config), f"run {run_name}", trust_code)
    cfg = validate(run.config, f"run {run_name} config")
    check_device(cfg.device)
    return Plan("resume", run.name, cfg, generations, run=run, take_over=take_over,
                accept_changed_inputs=accept_changed_inputs)


def for_fork(ledger: Ledger, ref: str, new_name: str, overrides: list[str], generations: int | None,
             trust_code: bool, accept_changed_inputs: bool) -> Plan:
    """A child of `ref` with the parent's config and `overrides`; every refusal that needs
    no model is taken here, before the child exists (the parent's config validated once)."""
    check_run_name(new_name)
    parent, gen = resolve_ref(ledger, ref)
    data = apply_overrides(dict(parent.config), list(overrides))
    inherited = set(stored_code(parent.config))
    check_stored_code([r for r in stored_code(data) if r in inherited], f"run {parent.name}", trust_code)
    cfg = validate(data, "fork config", overrides=overrides)
    check_device(cfg.device)
    if cfg.model != parent.base_model:
        raise SeedLedgerError("a fork keeps its parent's base model; `model` cannot be changed")
    parent_cfg = validate(parent.config, f"run {parent.name} config")
    if not cfg.same_master(parent_cfg):
        raise SeedLedgerError("a fork trains its parent's parameters; `train` cannot be changed")
    if ledger.has_run(new_name):
        raise SeedLedgerError(f"run {new_name!r} exists; pick another --run")
    forkcheck.check_policy(ledger, parent.name, gen, cfg)  # a refusal leaves no child behind
    return Plan("fork", new_name, cfg, generations, parent=parent, at=gen,
                regroup=_rows_changed(parent_cfg, cfg, overrides), accept_changed_inputs=accept_changed_inputs)


def _rows_changed(parent: TrainConfig, child: TrainConfig, overrides: list[str]) -> bool:
    """Whether a fork must choose its own `members_per_forward`: it changed what a forward
    group holds (the kind, batch, samples) without setting the group size itself."""
    if any(o.partition("=")[0].strip() == "members_per_forward" for o in overrides):
        return False
    same = ("train", "batch_size", "passk", "population")
    return any(getattr(parent, k) != getattr(child, k) for k in same)


def run_spec(plan: Plan, cfg: TrainConfig, base_fingerprint: str | None) -> RunSpec:
    """The row a new run is created with: a fork keeps its parent's base and takes its own
    kind (each run replays with its own), settings and key; a new lineage records the
    base its pool loaded (`base_fingerprint`)."""
    kind = cfg.perturbation_spec()
    own = {
        "noise_spec": kind.noise_spec,
        "param_selection": kind.param_selection,
        "dtype_policy": dtype_policy(cfg),
        "config": cfg.model_dump(mode="json"),
        "seed": cfg.seed,
        "run_key": run_key(cfg.seed),
        "software": software_versions(),
        "host": socket.gethostname(),
    }
    if plan.parent is not None:
        return replace(plan.parent.spec(), **own)
    return RunSpec(base_model=cfg.model, base_revision=model_revision(cfg.model),
                   base_fingerprint=base_fingerprint, **own)


def dtype_policy(cfg: TrainConfig) -> str:
    """The run's `dtype_policy`: what is kept in fp32, and what evaluation runs in."""
    if cfg.train == "full":
        return f"fp32-master/{cfg.dtype}-eval"
    return cfg.train.dtype_policy(cfg.dtype, cfg.base_quantization)


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
