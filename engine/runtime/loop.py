"""The generation loop: the ledger's one writer.

Per generation: the schedule's lr and σ; the policy (`trainers.policy`, chosen by the
config: ES, GA, CMA-ES or LM-MA-ES) names the members; the pool builds the generation's
deterministic batch once and scores every member on it; the rewards' state (KL's β, the
curriculum's level: `trainers.fitness`) settles the rewards; the policy decides
the coefficients and the update rule; the generation record is built; *that record* is
applied through replay's update (the function `rebuild` and `verify` use) and the
fingerprint of the result taken; the record, fingerprint included, commits in one
transaction. A member is one `trainers.member.Member` from `ask` to `Member.record`. The
loop knows no algorithm: it never scales a reward.

Why apply before commit (the founding design, docs/design.md "Decisions that changed",
says "commits a record, then applies that record"):
the record carries the fingerprint after its update, so the update has to run first to
know it. What is applied is still exactly what commits: the step is built from the
record, and only the fingerprint and timings are filled in afterwards. Committing first
would need a second write for the fingerprint, so a crash between the two would leave a
committed generation without one. As it is, a crash anywhere before the commit's
transaction ends loses only the generation in flight (the master lives in memory), and
`resume` recomputes it to the same bits (deterministic batches, keys and decoding).

Timings (seconds, stored with the record): `evaluate` (all members), `load_member`
(building member weights, summed over members; part of `evaluate`), `update` (rewards to
coefficients, the record, replay's update and the fingerprint) and `previous_commit`: how
long the *previous* generation's commit took in this process. A record cannot hold the
time of its own commit, so that figure rides on the next record (a session's first
generation has none). Each commit's time also goes to the loggers as `commit_seconds`,
and `Hooks.on_generation_end`'s `seconds` spans the whole generation, commit included.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

from seedledger.engine.config import TrainConfig
from seedledger.engine.runtime.console.interrupts import raise_pending
from seedledger.engine.runtime.failpoints import failpoint
from seedledger.engine.runtime.hooks import Hooks
from seedledger.engine.runtime.scoring.evaluator import Batch
from seedledger.engine.runtime.scoring.no_signal import advice
from seedledger.ledger import GenerationRecord, Ledger, ReplayStep, RunInfo
from seedledger.replay.anchors import save_anchor
from seedledger.replay.kinds import from_run
from seedledger.replay.paths import StateView
from seedledger.trainers.fitness import GenerationState
from seedledger.trainers.member import Member
from seedledger.trainers.policy import Decision, make_policy
from seedledger.trainers.policy_base import applied_sigma


def train(
    ledger: Ledger,
    run: RunInfo,
    cfg: TrainConfig,
    pool,
    generations: int,
    *,
    anchors_dir: Path | None = None,
    loggers=None,
    hooks: Hooks | None = None,
    heartbeat: Callable[[], None] | None = None,
) -> list[GenerationRecord]:
    """Train `generations` more generations of `run`; the pool must hold `run`'s latest."""
    hooks = hooks or Hooks()
    policy = make_policy(cfg)
    trained = from_run(run.noise_spec, run.param_selection).trained
    start = ledger.latest_generation(run.name)
    history = ledger.records(run.name, upto=start)
    state = policy.restore(history)  # the policy's State: a pure function of the records
    rewards = GenerationState.restore(cfg, pool.task, history)  # KL's β, the curriculum's level
    streak = no_signal_streak(history)  # generations in a row without signal, resume included
    if generations and (note := sigma_note(cfg)):
        hooks.on_notice("note", note)
    committed: list[GenerationRecord] = []
    previous_commit: float | None = None  # seconds the last commit of this session took
    for generation in range(start + 1, start + generations + 1):
        started = time.perf_counter()
        if policy.needs_state:  # members built from dot products with LM-MA-ES's paths
            state = policy.attach(state, StateView(*pool.state(), trained))
        lr, sigma, policy_extra = policy.hyperparameters(state, generation)
        members, state = policy.ask(state, run.run_key, generation, sigma=sigma)
        hooks.on_generation_start(generation, len(members))
        raise_pending()  # an interrupt a finalizer swallowed still stops the session
        batch = pool.batch(generation, rewards.level)
        members = pool.evaluate(members, sigma, generation, run.run_key, batch,
                                on_member=member_heard(hooks, heartbeat, generation), heartbeat=heartbeat)
        failpoint("evaluated", generation)
        evaluated = time.perf_counter()
        members, objectives, extra = rewards.settle(generation, members)
        decision = policy.decide(state, members, lr=lr, sigma=sigma, optimizer=cfg.optimizer, objectives=objectives)
        record = generation_record(generation, lr, sigma, batch, members, decision, policy_extra | extra)
        record.fingerprint = pool.apply(record_to_step(run, record))
        applied = time.perf_counter()
        failpoint("applied", generation)
        record.timings = timings(started, evaluated, applied, members, previous_commit)
        failpoint("commit", generation)
        committing = time.perf_counter()
        ledger.commit_generation(run.name, record)
        done = time.perf_counter()
        failpoint("committed", generation)
        state = policy.observe(state, record)
        previous_commit = done - committing
        committed.append(record)

        if cfg.anchor_every and anchors_dir and generation % cfg.anchor_every == 0:
            save_anchor(ledger, run.name, generation, *pool.state(), anchors_dir)
        if loggers is not None:
            loggers.log_generation(generation, generation_metrics(record, done - started, previous_commit))
        hooks.on_generation_end(record, done - started)
        streak = streak + 1 if no_signal(record) else 0
        if streak:
            message, payload = no_signal_warning(record, streak, cfg)
            ledger.log_event(run.name, "no-signal", payload)
            hooks.on_notice("warning", message)
        if hooks.should_stop():
            break
    return committed


def sigma_note(cfg: TrainConfig) -> str | None:
    """The notice for a σ that is applied rounded (None when it is exact)."""
    applied = applied_sigma(cfg.sigma)
    if applied == cfg.sigma:
        return None
    return (f"sigma {cfg.sigma:g} is applied as {applied:.6g}: rounded to 12 significant bits so "
            "that every σ·ε is exact in fp32 (`log` and `show` print the applied value)")


def member_heard(hooks: Hooks, heartbeat: Callable[[], None] | None, generation: int) -> Callable[[Member], None]:
    """What runs as each scored member comes back: interrupts, progress, the writer lease."""

    def on_member(member: Member) -> None:
        raise_pending()
        hooks.on_member(member)
        if heartbeat is not None:
            heartbeat()  # keep the writer lease while a long generation evaluates
        failpoint("member", generation)

    return on_member


def generation_record(
    generation: int, lr: float, sigma: float, batch: Batch, members: list[Member], decision: Decision, extra: dict,
) -> GenerationRecord:
    """The record to apply and commit (fingerprint and timings filled in afterwards)."""
    return GenerationRecord(
        index=generation,
        lr=lr,
        sigma=sigma,
        population=len(members),
        optimizer=decision.optimizer,
        schedule_step=generation,
        batch_indices=batch.indices,
        members=[m.record(c) for m, c in zip(members, decision.coefficients, strict=True)],
        fingerprint="",
        timings={},
        extra=extra | decision.extra,  # e.g. the adapted lr/σ, KL's β, a GA's parents
    )


def timings(started: float, evaluated: float, applied: float, members: list[Member],
            previous_commit: float | None) -> dict[str, float]:
    """The record's timings (the module docstring)."""
    out = {
        "evaluate": evaluated - started,
        "load_member": sum(m.seconds.get("load_member", 0.0) for m in members),
        "update": applied - evaluated,
        "wall": applied - started,  # the generation up to its commit (the parts above overlap)
    }
    if previous_commit is not None:
        out["previous_commit"] = previous_commit
    return out


def no_signal(record: GenerationRecord) -> bool:
    """Every coefficient is zero: the members' rewards did not differ, so this generation
    cannot move the weights (momentum and Adam only replay their past)."""
    return all(m.coefficient == 0.0 for m in record.members)


def no_signal_streak(history: list[GenerationRecord]) -> int:
    """How many generations at the end of `history` had no signal."""
    streak = 0
    for record in reversed(history):
        if not no_signal(record):
            break
        streak += 1
    return streak


def no_signal_warning(record: GenerationRecord, streak: int, cfg: TrainConfig) -> tuple[str, dict]:
    """The console line and the event payload for a generation without signal, with what to
    change for this run (`engine.runtime.scoring.no_signal`)."""
    rewards = [m.reward for m in record.members]
    unscored = all(v is None for m in record.members for v in m.components.values())
    why = (
        "no reward function returned a value for any sample (None and NaN mean 'not applicable')"
        if unscored and record.members[0].components
        else f"every member's reward is {rewards[0]:.4g}"
    )
    times = "1 generation" if streak == 1 else f"{streak} generations in a row"
    message = (
        f"generation {record.index}: no signal ({why}), so the update is zero; {times} without "
        f"signal. Check the reward (answer format, max_new_tokens), or {advice(cfg, record.sigma)}"
    )
    return message, {"generation": record.index, "reward": rewards[0], "streak": streak, "why": why}


def hyperparameters(cfg: TrainConfig, generation: int) -> tuple[float, float]:
    """(lr, σ) in force at `generation` of a run without adaptation (benchmarks); σ is
    rounded so σ·ε is exact in fp32. The loop asks its policy, which may adapt them."""
    policy = make_policy(cfg)
    return policy.hyperparameters(policy.start(), generation)[:2]


def record_to_step(run: RunInfo, record: GenerationRecord) -> ReplayStep:
    """The step training applies: the record, with its run's perturbation kind."""
    return ReplayStep(
        run=run.name,
        index=record.index,
        keys=[m.key for m in record.members],
        coefficients=[m.coefficient for m in record.members],
        sigma=record.sigma,
        optimizer=record.optimizer,
        noise_spec=run.noise_spec,
        param_selection=run.param_selection,
    )


def generation_metrics(
    record: GenerationRecord, seconds: float, commit_seconds: float | None = None
) -> dict[str, float]:
    rewards = [m.reward for m in record.members]
    metrics = {
        "reward/mean": sum(rewards) / len(rewards),
        "reward/max": max(rewards),
        "reward/min": min(rewards),
        "lr": record.lr,
        "sigma": record.sigma,
        "seconds": seconds,
    }
    if "kl" in record.extra:
        metrics["kl/mean"] = record.extra["kl"]["mean"]
        metrics["kl/beta"] = record.extra["kl"]["beta"]
    if commit_seconds is not None:
        metrics["commit_seconds"] = commit_seconds  # this generation's commit, part of `seconds`
    return metrics
