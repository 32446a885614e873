"""The generation loop: the ledger's one writer.

Per generation: the schedule's lr and σ; the policy (`trainers.policy`, chosen by the
config: ES, GA or CMA-ES) names the members; the pool scores every member on the generation's
deterministic batch; the policy turns rewards into coefficients; the generation record
is built; *that record* is applied through replay's update (the function `rebuild` and
`verify` use) and the fingerprint of the result taken; the record, fingerprint included,
commits in one transaction. The loop knows no algorithm: it never scales a reward.

Why apply before commit (the founding design, docs/design.md "Decisions that changed", says "commits a record, then applies that record"):
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
from seedledger.engine.runtime.evaluator import MemberResult
from seedledger.engine.runtime.failpoints import failpoint
from seedledger.engine.runtime.hooks import Hooks
from seedledger.engine.runtime.interrupts import raise_pending
from seedledger.engine.runtime.signal_advice import advice
from seedledger.ledger import GenerationRecord, Ledger, MemberRecord, ReplayStep, RunInfo
from seedledger.replay.anchors import save_anchor
from seedledger.replay.noise import round_coefficient
from seedledger.replay.paths import StateView
from seedledger.replay.perturbation import Perturbation
from seedledger.trainers.policy import make_policy
from seedledger.trainers.rewards.curriculum import Curriculum
from seedledger.trainers.rewards.kl import next_beta


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
    change for this run (`engine.runtime.signal_advice`)."""
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
    return make_policy(cfg).hyperparameters(generation)[:2]


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
    perturbation = Perturbation.from_run(run.noise_spec, run.param_selection)
    start = ledger.latest_generation(run.name)
    history = ledger.records(run.name, upto=start)
    policy.restore(history)  # state across generations is a pure function of the records
    curriculum = restore_curriculum(cfg, pool.task, history)
    streak = no_signal_streak(history)  # generations in a row without signal, resume included
    applied = round_coefficient(cfg.sigma)
    if generations and applied != cfg.sigma:
        hooks.on_notice(
            "note",
            f"sigma {cfg.sigma:g} is applied as {applied:.6g}: rounded to 12 significant bits so "
            "that every σ·ε is exact in fp32 (`log` and `show` print the applied value)",
        )
    kl_beta = restore_kl_beta(cfg, history)
    committed = []
    previous_commit: float | None = None  # seconds the last commit of this session took
    for generation in range(start + 1, start + generations + 1):
        started = time.perf_counter()
        if hasattr(policy, "attach"):  # members built from dot products with LM-MA-ES's paths
            policy.attach(StateView(*pool.state(), perturbation.trained))
        lr, sigma, policy_extra = policy.hyperparameters(generation)
        members = policy.ask(run.run_key, generation)
        hooks.on_generation_start(generation, len(members))

        raise_pending()  # an interrupt a finalizer swallowed still stops the session

        def on_member(result: MemberResult, generation: int = generation) -> None:
            raise_pending()
            hooks.on_member(result)
            if heartbeat is not None:
                heartbeat()  # keep the writer lease while a long generation evaluates
            failpoint("member", generation)

        level = curriculum.level if curriculum else None
        results = pool.evaluate(
            members, sigma, generation, run.run_key, on_member, level, heartbeat=heartbeat
        )
        failpoint("evaluated", generation)
        evaluated = time.perf_counter()

        objectives = dict(pool.task.objectives())
        extra = dict(policy_extra)  # e.g. the adapted lr/σ in force (trainers.adaptation)
        if cfg.kl is not None:
            extra["kl"] = penalise_kl(results, kl_beta)
            objectives["kl"] = -kl_beta  # Pareto shaping: a smaller KL is better
            completions = len(results) * cfg.batch_size * (cfg.passk.n if cfg.passk else 1)
            k = cfg.kl
            kl_beta = next_beta(kl_beta, extra["kl"]["mean"], k.target, completions, k.horizon)
        rewards = [r.reward for r in results]
        coefficients = policy.tell(members, rewards, lr=lr, optimizer=cfg.optimizer,
                                   components=[r.components for r in results],
                                   objectives=objectives,
                                   sample_rewards=[r.sample_rewards for r in results])
        extra |= policy.told()  # e.g. a GA's parents, crossover key and species
        batch_indices, _ = pool_batch(pool, cfg, generation, level)
        if curriculum:
            rate = sum(r.success for r in results) / len(results)
            extra |= {"level": level, "success_rate": rate}
            change = curriculum.observe(generation, rate)
            if change:
                extra["curriculum"] = change  # commits with the generation: the level's audit trail
        record = GenerationRecord(
            index=generation,
            lr=lr,
            sigma=sigma,
            population=len(members),
            optimizer=policy.update_rule(lr) if hasattr(policy, "update_rule") else cfg.optimizer.record(lr),
            schedule_step=generation,
            batch_indices=batch_indices,
            members=[
                MemberRecord(
                    index=m.index,
                    key=m.key,
                    sign=m.sign,
                    reward=r.reward,
                    coefficient=c,
                    components=r.components,
                    samples=r.samples,
                )
                for m, r, c in zip(members, results, coefficients, strict=True)
            ],
            fingerprint="",
            timings={},
            extra=extra,
        )
        record.fingerprint = pool.apply(record_to_step(run, record))
        applied = time.perf_counter()
        failpoint("applied", generation)
        record.timings = {
            "evaluate": evaluated - started,
            "load_member": sum(r.seconds.get("load_member", 0.0) for r in results),
            "update": applied - evaluated,
            "wall": applied - started,  # the generation up to its commit (the parts above overlap)
        }
        if previous_commit is not None:
            record.timings["previous_commit"] = previous_commit
        failpoint("commit", generation)
        committing = time.perf_counter()
        ledger.commit_generation(run.name, record)
        done = time.perf_counter()
        failpoint("committed", generation)
        policy.observe(record)
        previous_commit = done - committing
        committed.append(record)
        seconds = done - started

        if cfg.anchor_every and anchors_dir and generation % cfg.anchor_every == 0:
            master, state = pool.state()
            save_anchor(ledger, run.name, generation, master, state, anchors_dir)
        if loggers is not None:
            loggers.log_generation(generation, generation_metrics(record, seconds, previous_commit))
        hooks.on_generation_end(record, seconds)
        streak = streak + 1 if no_signal(record) else 0
        if streak:
            message, payload = no_signal_warning(record, streak, cfg)
            ledger.log_event(run.name, "no-signal", payload)
            hooks.on_notice("warning", message)
        if hooks.should_stop():
            break
    return committed


def pool_batch(pool, cfg: TrainConfig, generation: int, level: int | None) -> tuple[list[int], list]:
    """The generation's batch indices, from the same deterministic function workers use."""
    if level is not None:
        pool.task.set_level(level)
    return pool.task.train_batch(cfg.seed, generation, cfg.batch_size)


def penalise_kl(results: list[MemberResult], beta: float) -> dict[str, float]:
    """reward − β·KL for every member, in place: the penalised reward is what the policy
    ranks and the ledger records; the task's own reward and the KL stay as components."""
    for r in results:
        r.components = {**r.components, "task_reward": r.reward, "kl": r.kl}
        r.reward = r.reward - beta * r.kl
    return {"beta": beta, "mean": sum(r.kl for r in results) / len(results)}


def restore_kl_beta(cfg: TrainConfig, history: list[GenerationRecord]) -> float:
    """The β in force for the next generation: `kl.beta` when fixed; with a `kl.target`,
    the controller's next step from the last recorded (β, mean KL), so a resumed or
    forked run continues where it left off."""
    if cfg.kl is None:
        return 0.0
    last = next((r for r in reversed(history) if "kl" in r.extra), None)
    if cfg.kl.target is None or last is None:
        return cfg.kl.beta
    k = cfg.kl
    completions = last.population * len(last.batch_indices) * (cfg.passk.n if cfg.passk else 1)
    return next_beta(last.extra["kl"]["beta"], last.extra["kl"]["mean"], k.target, completions, k.horizon)


def restore_curriculum(cfg: TrainConfig, task, history: list[GenerationRecord]) -> Curriculum | None:
    """The curriculum as of the end of `history`: it is a pure function of the success rates
    recorded there, so a resumed or forked run continues at the level it left."""
    if cfg.curriculum is None:
        return None
    c = cfg.curriculum
    curriculum = Curriculum(
        task.levels, task.level, c.window, raise_above=c.raise_above, lower_below=c.lower_below
    )
    for record in history:
        if "success_rate" in record.extra:
            curriculum.observe(record.index, record.extra["success_rate"])
    return curriculum


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
