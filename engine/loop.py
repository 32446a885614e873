"""The generation loop: the ledger's one writer.

Per generation: the schedule's lr and σ; the ES policy names the members (keys derived
from the run key and the generation); the pool scores every member on the generation's
deterministic batch; the policy turns rewards into coefficients; the record is applied
through replay's update and its fingerprint taken; the record commits in one
transaction. A crash before the commit loses only the generation in flight, and
`resume` recomputes it to the same bits (deterministic batches, keys and decoding).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from engine.config import TrainConfig
from engine.evaluator import MemberResult
from engine.failpoints import failpoint
from ledger import GenerationRecord, Ledger, MemberRecord, ReplayStep, RunInfo
from replay.anchors import save_anchor
from replay.noise import round_coefficient
from trainers.es import ES
from trainers.rewards.curriculum import Curriculum


@dataclass
class Hooks:
    """Progress callbacks; the CLI draws a progress bar from them, tests ignore them."""

    on_generation_start: Callable[[int, int], None] = lambda generation, members: None
    on_member: Callable[[MemberResult], None] = lambda result: None
    on_generation_end: Callable[[GenerationRecord, float], None] = lambda record, seconds: None


def hyperparameters(cfg: TrainConfig, generation: int) -> tuple[float, float]:
    """(lr, σ) in force at `generation`; σ is rounded so σ·ε is exact in fp32."""
    lr = cfg.lr * cfg.schedule.lr.factor(generation, cfg.generations)
    sigma = round_coefficient(cfg.sigma * cfg.schedule.sigma.factor(generation, cfg.generations))
    return lr, sigma


def record_to_step(run: str, record: GenerationRecord) -> ReplayStep:
    return ReplayStep(
        run=run,
        index=record.index,
        keys=[m.key for m in record.members],
        coefficients=[m.coefficient for m in record.members],
        sigma=record.sigma,
        optimizer=record.optimizer,
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
    strategy = ES(cfg.population, mirrored=cfg.mirrored, shaping=cfg.shaping)
    start = ledger.latest_generation(run.name)
    curriculum = restore_curriculum(cfg, pool.task, ledger.records(run.name, upto=start))
    committed = []
    for generation in range(start + 1, start + generations + 1):
        started = time.perf_counter()
        lr, sigma = hyperparameters(cfg, generation)
        members = strategy.ask(run.run_key, generation)
        hooks.on_generation_start(generation, len(members))

        def on_member(result: MemberResult, generation: int = generation) -> None:
            hooks.on_member(result)
            if heartbeat is not None:
                heartbeat()  # keep the writer lease while a long generation evaluates
            failpoint("member", generation)

        level = curriculum.level if curriculum else None
        results = pool.evaluate(members, sigma, generation, run.run_key, on_member, level)
        failpoint("evaluated", generation)
        evaluated = time.perf_counter()

        rewards = [r.reward for r in results]
        scale = (lr if cfg.optimizer.folds_lr else 1.0) / len(members)
        coefficients = strategy.tell(members, rewards, scale=scale)
        batch_indices, _ = pool_batch(pool, cfg, generation, level)
        extra = {}
        if curriculum:
            rate = sum(r.success for r in results) / len(results)
            extra = {"level": level, "success_rate": rate}
            change = curriculum.observe(generation, rate)
            if change:
                extra["curriculum"] = change  # commits with the generation: the level's audit trail
        record = GenerationRecord(
            index=generation,
            lr=lr,
            sigma=sigma,
            population=len(members),
            optimizer=cfg.optimizer.record(lr),
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
        record.fingerprint = pool.apply(record_to_step(run.name, record))
        applied = time.perf_counter()
        failpoint("applied", generation)
        record.timings = {
            "evaluate": evaluated - started,
            "load_member": sum(r.seconds.get("load_member", 0.0) for r in results),
            "update": applied - evaluated,
        }
        ledger.commit_generation(run.name, record)
        failpoint("committed", generation)
        committed.append(record)
        seconds = time.perf_counter() - started

        if cfg.anchor_every and anchors_dir and generation % cfg.anchor_every == 0:
            master, state = pool.state()
            save_anchor(ledger, run.name, generation, master, state, anchors_dir)
        if loggers is not None:
            loggers.log_generation(generation, generation_metrics(record, seconds))
        hooks.on_generation_end(record, seconds)
    return committed


def pool_batch(pool, cfg: TrainConfig, generation: int, level: int | None) -> tuple[list[int], list]:
    """The generation's batch indices, from the same deterministic function workers use."""
    if level is not None:
        pool.task.set_level(level)
    return pool.task.train_batch(cfg.seed, generation, cfg.batch_size)


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


def generation_metrics(record: GenerationRecord, seconds: float) -> dict[str, float]:
    rewards = [m.reward for m in record.members]
    return {
        "reward/mean": sum(rewards) / len(rewards),
        "reward/max": max(rewards),
        "reward/min": min(rewards),
        "lr": record.lr,
        "sigma": record.sigma,
        "seconds": seconds,
    }
