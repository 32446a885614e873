"""Training sessions: open the ledger, provision the model, hold the lease, run the loop.

`train`, `resume` and `fork` differ only in where the config and the rows come from and
in the refusals that need no model: each makes a `Plan` (engine.runtime.setup.plans),
and `_session` runs every plan down one path: lease the run as soon as its row exists
(a resume's before anything loads), configure for this host (model, backend, preflight,
sizes), compare the inputs, create the row where there is none (a new lineage's after its
pool, whose base fingerprint the row stores), restore the pool, record the inputs, train.
The lease and signal guards are engine.runtime.setup.guards.
`--generations N` says how many to train in this session; the config's `generations` is
the run's target (schedules are laid out over it), which `resume` and `fork` continue
towards by default.
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass
from pathlib import Path

from seedledger.engine.config import TrainConfig
from seedledger.engine.runtime.backends import choice
from seedledger.engine.runtime.console.interrupts import signals_held
from seedledger.engine.runtime.dirs import anchors_dir, log_dir
from seedledger.engine.runtime.hooks import Hooks
from seedledger.engine.runtime.loop import train
from seedledger.engine.runtime.models import adapters
from seedledger.engine.runtime.models.resolve import resolve_model
from seedledger.engine.runtime.pools import make_pool
from seedledger.engine.runtime.setup import batching, forkcheck, plans, preflight
from seedledger.engine.runtime.setup.guards import LEASE_TTL, interruptible, rolled_back, unkept
from seedledger.engine.runtime.setup.guards import (
    keepalive as _keepalive,  # engine.search.studystore's name
)
from seedledger.engine.runtime.setup.inputs import SessionInputs
from seedledger.engine.runtime.setup.stored_code import (  # engine.search's names
    check_stored_code as check_stored_code,
)
from seedledger.engine.runtime.setup.stored_code import stored_code as stored_code
from seedledger.ledger import GenerationRecord, Ledger, RunInfo
from seedledger.ledger.errors import SeedLedgerError
from seedledger.ledger.provenance import trained_inputs
from seedledger.replay.kinds import from_run


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
        if cfg.evaluation.every:  # held-out scores beside the loop (engine.runtime.scoring.heldout)
            from seedledger.engine.runtime.scoring.heldout import DuringTraining

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
    return _session(ledger, plans.for_start(ledger, config, run_name, overrides, generations), hooks)


def resume(
    ledger: Ledger, run_name: str, generations: int | None, hooks: Hooks | None = None,
    take_over: bool = False, *, trust_code: bool = False, accept_changed_inputs: bool = False,
):
    """Continue `run_name`. The writer lease is taken first: a second `resume` of a run
    being trained is refused (naming the holder) before it loads or replays anything,
    and leaves no `resume` event. A lease left by a dead session is taken over: at once
    when its holder was on this host, with `take_over` when it was on another (whose
    process this host cannot see); `hooks.on_notice` says so. Reward code the stored
    config names is imported only with `trust_code`. Inputs (engine.runtime.setup.inputs) that
    differ from those that trained the latest generation are refused before the model loads, unless
    `accept_changed_inputs`."""
    plan = plans.for_resume(ledger, run_name, generations, take_over, trust_code, accept_changed_inputs)
    return _session(ledger, plan, hooks)


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
    plan = plans.for_fork(ledger, ref, new_name, overrides, generations, trust_code, accept_changed_inputs)
    return _session(ledger, plan, hooks)


def _session(ledger: Ledger, plan: plans.Plan, hooks: Hooks | None) -> SessionResult:
    """Every session's one path (the module docstring's order). The run is leased as soon
    as its row exists and `interruptible` from then on; before that, an interrupt keeps
    nothing; a fork's child whose setup fails is deleted again."""
    hooks = hooks or Hooks()
    with contextlib.ExitStack() as held:
        run, at, lease = plan.run, plan.at, None
        if run is not None:  # an existing run: refused at once while another session holds it
            lease = _leased(held, ledger, run.name, plan.take_over, hooks)
            at = ledger.latest_generation(run.name)  # read under the lease: no one commits now
        count = max(target_generation(plan.cfg) - at, 0) if plan.generations is None else plan.generations
        if run is not None and count == 0:  # nothing to do: no model loaded, no replay
            settle_status(ledger, run.name, plan.cfg)
            fp = ledger.generation(run.name, at).fingerprint if at else run.base_fingerprint
            return SessionResult(ledger.get_run(run.name), [], fp, at)
        pool, source = None, plan.continues
        with contextlib.nullcontext() if run is not None else unkept(f"before run {plan.name} was created"):
            cfg, model_dir = _configured(plan)  # before a new run exists: a setting that cannot work is exit 2
            read = SessionInputs.of(cfg, model_dir)
            if source is not None:
                read.compare(trained_inputs(ledger, source.name, at),
                             f"the session that trained {source.name}@{at}", plan.accept_changed_inputs)
            else:  # a new lineage: its row stores the pool's base fingerprint
                pool = held.enter_context(contextlib.closing(make_pool(cfg, model_dir)))
        if run is None:
            spec = plans.run_spec(plan, cfg, pool.base_fingerprint() if pool is not None else None)
            run = ledger.create_run(plan.name, spec, parent=(plan.parent.name, at) if plan.parent else None)
            lease = _leased(held, ledger, run.name, plan.take_over, hooks)
        with (rolled_back(ledger, lease, run.name, f"while fork {run.name} was set up") if plan.parent is not None
              else contextlib.nullcontext()):
            restored = _restored(ledger, lease, cfg, model_dir, plan, run, at, pool)
        if pool is None:  # made under the lease: closed before it is released
            pool = held.enter_context(contextlib.closing(restored))
        if plan.run is not None:
            ledger.log_event(run.name, "resume", {"from_generation": at, "generations": count})
        read.record(ledger, run.name, plan.session, at)
        if source is None and cfg.backend == "module":  # what it trains, and its base beside the ledger
            from seedledger.engine.runtime.models.module import record_base

            record_base(ledger, run.name, cfg.model, anchors_dir(ledger))
        return _run_loop(ledger, run, cfg, pool, count, hooks, lease)


def _leased(held: contextlib.ExitStack, ledger: Ledger, name: str, take_over: bool, hooks: Hooks):
    """Run `name`'s writer lease, held (and the run `interruptible`) until `held` closes."""
    lease = held.enter_context(ledger.lease(name, ttl=LEASE_TTL).acquire(force=take_over))
    held.enter_context(interruptible(ledger, name))
    if lease.takeover is not None:
        hooks.on_notice("note", lease.describe_takeover())
    return lease


def _configured(plan: plans.Plan) -> tuple[TrainConfig, Path]:
    """The model's directory, and the plan's config with its backend chosen (`auto`
    becomes what this host runs, once, before a run row is written; a stored config
    already names one) and checked by preflight (exit 2); a new lineage's adapter and
    `members_per_forward` filled in where left open, a regrouped fork's chosen again."""
    model_dir = resolve_model(plan.cfg.model)
    cfg = plan.cfg.model_copy(update={"backend": choice.resolve(plan.cfg, model_dir)})
    preflight.check(cfg, model_dir)
    if plan.continues is None:
        cfg = adapters.resolve(cfg)
    if plan.regroup:
        cfg = cfg.model_copy(update={"members_per_forward": None})
    if plan.continues is None or plan.regroup:
        cfg = cfg.model_copy(update={"members_per_forward": batching.resolve(cfg, model_dir)})
    return cfg, model_dir


def _restored(ledger: Ledger, lease, cfg: TrainConfig, model_dir: Path, plan: plans.Plan, run: RunInfo,
              at: int, pool=None):
    """`pool` (else a new one) holding `run` at `at`, under `lease` (renewed meanwhile:
    loading and replaying can outlast it); the base of the history it continues checked,
    and a fork's policy asked again with the weights; a pool made here is closed again
    when this fails."""
    with _keepalive(lease):
        made = pool is None
        pool = make_pool(cfg, model_dir) if made else pool
        try:
            if plan.continues is not None:
                _check_base(plan.continues, pool.base_fingerprint(), cfg)
            pool.restore(ledger, run.name, at, anchors_dir(ledger))
            if plan.parent is not None:
                forkcheck.check_policy(ledger, plan.parent.name, at, cfg, pool,
                                       from_run(run.noise_spec, run.param_selection).trained)
        except BaseException:
            if made:
                with signals_held():
                    pool.close()
            raise
    return pool


def _check_base(run: RunInfo, fingerprint: str, cfg: TrainConfig | None = None) -> None:
    if run.base_fingerprint and run.base_fingerprint != fingerprint:
        what = f"base model {run.base_model!r}"
        if cfg is not None and not cfg.on_weights():  # an adapter run's base is loaded as configured
            what += f" loaded with base_quantization {cfg.base_quantization}, with the run's initial adapter,"
        raise SeedLedgerError(
            f"{what} has fingerprint {fingerprint[:16]}…, but run "
            f"{run.name} was trained from {run.base_fingerprint[:16]}…: not the same weights"
        )
