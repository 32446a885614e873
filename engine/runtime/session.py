"""Training sessions: open the ledger, provision the model, hold the lease, run the loop.

`train`, `resume` and `fork` differ only in how the config and the run row are found and
in their own refusals; the setup after that is one path (`_configured`: model, backend,
preflight; `_batched`; `_restored`: the pool under the writer lease; `_run_loop`), and the
lease and signal guards are engine.runtime.session_guards. `--generations N` says how many to train
in this session; the config's `generations` is the run's target (schedules are laid out
over it), which `resume` and `fork` continue towards by default.
"""

from __future__ import annotations

import contextlib
import os
import platform
import socket
from dataclasses import dataclass, replace
from pathlib import Path

from seedledger.engine.config import TrainConfig, apply_overrides, load_config, validate
from seedledger.engine.refs import resolve_ref
from seedledger.engine.runtime import adapters, backend_choice, batching, forkcheck, preflight
from seedledger.engine.runtime.devices import check_device
from seedledger.engine.runtime.dirs import anchors_dir, log_dir
from seedledger.engine.runtime.hooks import Hooks
from seedledger.engine.runtime.inputs import SessionInputs
from seedledger.engine.runtime.interrupts import signals_held
from seedledger.engine.runtime.loop import train
from seedledger.engine.runtime.models import model_revision, resolve_model
from seedledger.engine.runtime.pools import make_pool
from seedledger.engine.runtime.session_guards import (
    LEASE_TTL,
    interruptible,
    name_taken,
    not_started,
)
from seedledger.engine.runtime.session_guards import (
    keepalive as _keepalive,  # engine.search.studystore's name
)
from seedledger.engine.runtime.stored_code import check_stored_code, stored_code
from seedledger.ledger import GenerationRecord, Ledger, RunInfo
from seedledger.ledger.errors import SeedLedgerError
from seedledger.ledger.names import check_run_name
from seedledger.ledger.provenance import trained_inputs
from seedledger.replay.kinds import from_run
from seedledger.replay.noise import run_key


@dataclass
class SessionResult:
    run: RunInfo
    records: list[GenerationRecord]  # committed by this session (none when already done)
    fingerprint: str  # of the master at `latest_generation`
    latest_generation: int

    def __repr__(self) -> str:
        """One line (the records hold every member's key and reward: read `records`)."""
        trained = f"{self.records[0].index}..{self.records[-1].index}" if self.records else "none"
        last = self.records[-1].reward_stats()["mean"] if self.records else None
        return (f"SessionResult(run={self.run.name!r}, status={self.run.status!r}, trained={trained}, "
                f"latest_generation={self.latest_generation}, reward_mean={last!r}, fingerprint={self.fingerprint!r})")


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


STATUSES = {
    "created": "the run exists; no session has trained it yet",
    "training": "a session holds the run's writer lease and trains it",
    "stopped": "the last session ended normally before the run reached its target generation",
    "finished": "the run reached its target generation (the config's `generations`)",
    "interrupted": "the last session ended by an error or a signal, or its process died",
    "imported": "made from a seed file and not trained in this ledger since",
}


def target_generation(cfg: TrainConfig) -> int:
    """The generation a run trains towards: the config's `generations`, counted along the
    lineage as schedules are (a fork at @g of a 10-generation config trains 10 - g)."""
    return cfg.generations


def settle_status(ledger: Ledger, name: str, cfg: TrainConfig) -> None:
    """After a session that trained nothing: a run at its target is `finished` (an imported
    run stays `imported`; anything else is left as it was)."""
    status = ledger.get_run(name).status
    if status in ("created", "stopped", "interrupted", "training") and (
        ledger.latest_generation(name) >= target_generation(cfg)
    ):
        ledger.set_status(name, "finished")


def _run_loop(ledger: Ledger, run: RunInfo, cfg: TrainConfig, pool, generations: int, hooks, lease):
    """Train under `lease` (held by the caller since before any work)."""
    loggers = None
    if cfg.report_to:
        from seedledger.engine.runtime.loggers import make_loggers

        loggers = make_loggers(cfg.report_to, run.name, log_dir(ledger), cfg.model_dump())
    try:
        if generations == 0:  # nothing to train: the status only catches up with the history
            settle_status(ledger, run.name, cfg)
            return SessionResult(run, [], pool.fingerprint(), ledger.latest_generation(run.name))
        scoring = None
        if cfg.evaluation.every:  # held-out scores beside the loop (engine.runtime.evaluation)
            from seedledger.engine.runtime.evaluation import DuringTraining

            scoring = DuringTraining(ledger, run.name, cfg, lease.heartbeat)
            hooks = scoring.start(hooks or Hooks())
        ledger.set_status(run.name, "training")
        try:
            records = train(
                ledger, run, cfg, pool, generations,
                anchors_dir=anchors_dir(ledger), loggers=loggers, hooks=hooks,
                heartbeat=lease.heartbeat,
            )
            if scoring is not None:
                scoring.finish(ledger.latest_generation(run.name))
        except BaseException as exc:
            # Clean-up writes may fail too (a full disk, a lost server): they never mask the
            # error. Then the run stays `training` under this process's lease, which the next
            # `resume` takes over (at once on this host, with --take-over on another).
            with contextlib.suppress(Exception):
                ledger.set_status(run.name, "interrupted")
            if isinstance(exc, Exception):
                with contextlib.suppress(Exception):  # the audit trail; never mask the error
                    failed = getattr(exc, "generation", None)  # an anchor's: committed
                    ledger.log_event(
                        run.name, "error",
                        {"error": type(exc).__name__, "message": str(exc),
                         "generation": failed or ledger.latest_generation(run.name) + 1},
                    )
            raise
        latest = ledger.latest_generation(run.name)
        ledger.set_status(run.name, "finished" if latest >= target_generation(cfg) else "stopped")
    finally:
        if loggers is not None:
            loggers.close()
    # The pool's own fingerprint of its master (a Ray pool's workers reported it): no
    # weights move to compute it.
    return SessionResult(run, records, pool.fingerprint(), latest)


def _configured(cfg: TrainConfig) -> tuple[TrainConfig, Path]:
    """The shared first step of every session: the model's directory, and `cfg` with its
    backend chosen (`auto` becomes what this host runs, once, before the run row is
    written; a stored config already names one) and checked by preflight (exit 2)."""
    model_dir = resolve_model(cfg.model)
    cfg = cfg.model_copy(update={"backend": backend_choice.resolve(cfg, model_dir)})
    preflight.check(cfg, model_dir)
    return cfg, model_dir


def _batched(cfg: TrainConfig, model_dir: Path) -> TrainConfig:
    """`cfg` with `members_per_forward` chosen (engine.runtime.batching) where it is left open."""
    return cfg.model_copy(update={"members_per_forward": batching.resolve(cfg, model_dir)})


def _restored(ledger: Ledger, lease, cfg: TrainConfig, model_dir: Path, base_of: RunInfo,
              name: str, gen: int):
    """A pool holding run `name` at `gen`, made under `lease` (renewed meanwhile: loading
    and replaying can outlast it), its base checked against `base_of` (the run, or a
    fork's parent); closed again when this fails."""
    with _keepalive(lease):
        pool = make_pool(cfg, model_dir)
        try:
            _check_base(base_of, pool.base_fingerprint(), cfg)
            pool.restore(ledger, name, gen, anchors_dir(ledger))
        except BaseException:
            with signals_held():
                pool.close()
            raise
    return pool


def start(
    ledger: Ledger,
    config: str | os.PathLike[str] | dict | None,
    run_name: str | None,
    overrides: list[str],
    generations: int | None,
    hooks: Hooks | None = None,
) -> SessionResult:
    """Create a run from `config` (a YAML file, a dict of config keys, or None for the
    defaults) and train it; the run is named `run_name`, else the file's stem, else `run`.
    The pool comes before the run row, which stores its base fingerprint."""
    if isinstance(config, dict):
        cfg = validate(apply_overrides(dict(config), overrides), "config", overrides=overrides)
        name = check_run_name(run_name or "run")
    else:
        cfg = load_config(config, overrides)
        name = check_run_name(run_name or (Path(config).stem if config else "run"))
    check_device(cfg.device)
    if ledger.has_run(name):
        raise SeedLedgerError(name_taken(ledger.get_run(name), cfg.model))
    try:
        cfg, model_dir = _configured(cfg)  # before the run exists: a setting that cannot work is exit 2
        cfg = _batched(adapters.resolve(cfg), model_dir)
        spec = cfg.perturbation_spec()
        read = SessionInputs.of(cfg, model_dir)
        pool = make_pool(cfg, model_dir)
    except BaseException as exc:
        not_started(exc, f"before run {name} was created")
        raise
    with contextlib.closing(pool):
        run = ledger.create_run(
            name=name,
            base_model=cfg.model,
            base_revision=model_revision(cfg.model),
            base_fingerprint=pool.base_fingerprint(),
            noise_spec=spec.noise_spec,
            dtype_policy=dtype_policy(cfg),
            param_selection=spec.param_selection,
            config=cfg.model_dump(mode="json"),
            seed=cfg.seed,
            run_key=run_key(cfg.seed),
            parent=None,
            software=software_versions(),
            host=socket.gethostname(),
        )
        with ledger.lease(run.name, ttl=LEASE_TTL) as lease, interruptible(ledger, run.name):
            pool.restore(ledger, run.name, 0, None)
            read.record(ledger, run.name, "train", 0)
            if cfg.backend == "module":  # what it trains, and its base beside the ledger
                from seedledger.engine.runtime.module_models import record_base

                record_base(ledger, run.name, cfg.model, anchors_dir(ledger))
            count = target_generation(cfg) if generations is None else generations
            return _run_loop(ledger, run, cfg, pool, count, hooks, lease)


def resume(
    ledger: Ledger, run_name: str, generations: int | None, hooks: Hooks | None = None,
    take_over: bool = False, *, trust_code: bool = False, accept_changed_inputs: bool = False,
):
    """Continue `run_name`. The writer lease is taken first: a second `resume` of a run
    being trained is refused (naming the holder) before it loads or replays anything,
    and leaves no `resume` event. A lease left by a dead session is taken over: at once
    when its holder was on this host, with `take_over` when it was on another (whose
    process this host cannot see); `hooks.on_notice` says so. Reward code the stored
    config names is imported only with `trust_code`. Inputs (engine.runtime.inputs) that
    differ from those that trained the latest generation are refused before the model loads, unless
    `accept_changed_inputs`."""
    run = ledger.get_run(run_name)
    check_stored_code(stored_code(run.config), f"run {run_name}", trust_code)
    cfg = validate(run.config, f"run {run_name} config")
    check_device(cfg.device)
    hooks = hooks or Hooks()
    with ledger.lease(run.name, ttl=LEASE_TTL).acquire(force=take_over) as lease, \
            interruptible(ledger, run.name):
        if lease.takeover is not None:
            hooks.on_notice("note", lease.describe_takeover())
        latest = ledger.latest_generation(run_name)  # read under the lease: no one commits now
        if generations is None:
            generations = max(target_generation(cfg) - latest, 0)
        if generations == 0:  # nothing to do: no model loaded, no replay
            settle_status(ledger, run_name, cfg)
            fp = ledger.generation(run_name, latest).fingerprint if latest else run.base_fingerprint
            return SessionResult(ledger.get_run(run_name), [], fp, latest)
        cfg, model_dir = _configured(cfg)
        read = SessionInputs.of(cfg, model_dir)
        read.compare(trained_inputs(ledger, run_name, latest), f"the session that trained {run_name}@{latest}",
                     accept_changed_inputs)
        with contextlib.closing(_restored(ledger, lease, cfg, model_dir, run, run.name, latest)) as pool:
            ledger.log_event(run.name, "resume", {"from_generation": latest, "generations": generations})
            read.record(ledger, run.name, "resume", latest)
            return _run_loop(ledger, run, cfg, pool, generations, hooks, lease)


def fork(
    ledger: Ledger,
    ref: str,
    new_name: str,
    overrides: list[str],
    generations: int | None,
    hooks: Hooks | None = None,
    *,
    trust_code: bool = False,
    accept_changed_inputs: bool = False,
) -> SessionResult:
    """Start `new_name` at `ref`. The child run is created and leased before the model is
    loaded (a racing fork of the same name fails at once); if setup then fails, before
    anything trained, the empty child is deleted so that its name stays free. Reward code
    the parent's stored config names is imported only with `trust_code` (code the
    overrides name is the user's own). Inputs that differ from those that trained `ref` are
    refused before the child exists, unless `accept_changed_inputs`."""
    check_run_name(new_name)
    parent, gen = resolve_ref(ledger, ref)
    data = apply_overrides(dict(parent.config), list(overrides))
    inherited = set(stored_code(parent.config))
    check_stored_code([r for r in stored_code(data) if r in inherited], f"run {parent.name}", trust_code)
    cfg = validate(data, "fork config", overrides=overrides)
    check_device(cfg.device)
    if cfg.model != parent.base_model:
        raise SeedLedgerError("a fork keeps its parent's base model; `model` cannot be changed")
    if cfg.train != validate(parent.config, f"run {parent.name} config").train:
        raise SeedLedgerError("a fork trains its parent's parameters; `train` cannot be changed")
    if ledger.has_run(new_name):
        raise SeedLedgerError(f"run {new_name!r} exists; pick another --run")
    forkcheck.check_policy(ledger, parent.name, gen, cfg)  # a refusal leaves no child behind
    cfg, model_dir = _configured(cfg)  # --set backend=auto chooses again
    if _rows_changed(validate(parent.config, f"run {parent.name} config"), cfg, overrides):
        cfg = _batched(cfg.model_copy(update={"members_per_forward": None}), model_dir)
    read = SessionInputs.of(cfg, model_dir)
    read.compare(trained_inputs(ledger, parent.name, gen),
                 f"the session that trained {parent.name}@{gen}", accept_changed_inputs)
    kind = cfg.perturbation_spec()  # a fork may change the kind: each run replays with its own
    spec = replace(  # the parent's base; this fork's perturbation, settings and key
        parent.spec(),
        noise_spec=kind.noise_spec,
        param_selection=kind.param_selection,
        dtype_policy=dtype_policy(cfg),
        config=cfg.model_dump(mode="json"),
        seed=cfg.seed,
        run_key=run_key(cfg.seed),
        software=software_versions(),
        host=socket.gethostname(),
    )
    run = ledger.create_run(new_name, spec, parent=(parent.name, gen))
    with ledger.lease(run.name, ttl=LEASE_TTL) as lease:
        pool = None
        try:
            pool = _restored(ledger, lease, cfg, model_dir, parent, run.name, gen)
            with _keepalive(lease):
                forkcheck.check_policy(ledger, parent.name, gen, cfg, pool,
                                       from_run(run.noise_spec, run.param_selection).trained)
        except BaseException as exc:
            with signals_held():
                if pool is not None:
                    pool.close()
                lease.release()
                with contextlib.suppress(Exception):
                    ledger.delete_run(run.name)
            not_started(exc, f"while fork {run.name} was set up")
            raise
        with contextlib.closing(pool), interruptible(ledger, run.name):
            read.record(ledger, run.name, "fork", gen)
            count = max(target_generation(cfg) - gen, 0) if generations is None else generations
            return _run_loop(ledger, run, cfg, pool, count, hooks, lease)


def dtype_policy(cfg: TrainConfig) -> str:
    """The run's `dtype_policy`: what is kept in fp32, and what evaluation runs in."""
    if cfg.train == "full":
        return f"fp32-master/{cfg.dtype}-eval"
    return cfg.train.dtype_policy(cfg.dtype, cfg.base_quantization)


def _rows_changed(parent: TrainConfig, child: TrainConfig, overrides: list[str]) -> bool:
    """Whether a fork must choose its own `members_per_forward`: it changed what a forward
    group holds (perturbation, batch, samples) without setting the group size itself."""
    if any(o.partition("=")[0].strip() == "members_per_forward" for o in overrides):
        return False
    same = ("perturbation", "batch_size", "passk", "population")
    return any(getattr(parent, k) != getattr(child, k) for k in same)


def _check_base(run: RunInfo, fingerprint: str, cfg: TrainConfig | None = None) -> None:
    if run.base_fingerprint and run.base_fingerprint != fingerprint:
        what = f"base model {run.base_model!r}"
        if cfg is not None and cfg.train != "full":  # an adapter run's base is loaded as configured
            what += f" loaded with base_quantization {cfg.base_quantization}, with the run's initial adapter,"
        raise SeedLedgerError(
            f"{what} has fingerprint {fingerprint[:16]}…, but run "
            f"{run.name} was trained from {run.base_fingerprint[:16]}…: not the same weights"
        )
