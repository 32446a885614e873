"""One model replica: its fp32 master, optimizer state, backend and task.

The local pool holds one of these in process; each Ray actor holds its own. Everything
that changes the master goes through `apply`, which calls replay's update: training and
replay share one code path (docs/design.md invariant 2).

Decoding. Training follows `sampling`: greedy at temperature 0, else seeded sampling with
the member's seed `member_key(run_key, generation, 1_000_000 + member)`, which the
backend splits per prompt (batch position) and per sample. Held-out evaluation is always
greedy, whatever `sampling` says, so its figures are deterministic and comparable. A
module run's held-out rows are its task's held-out seeds (`ModelTask.held_out_seeds`: episodes
no training generation plays), one reward per seed, with no decoding; the task names its rows
(`held_out_unit`), and `evaluate`'s report says so.

Rewards. The task scores every completion; what a member's scores mean (the mean, pass@k,
the success rate, the KL to the base) is `trainers.fitness.Fitness`'s, so this replica
decodes and scores but implements no reward semantics. With pass@k (`passk: {n, k}`)
each prompt is sampled n times (sample s of prompt i seeded by (member seed, i, s);
sample 0 is the plain sampling's draw).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from seedledger.engine.config import TrainConfig
from seedledger.engine.runtime.backends import make_backend
from seedledger.engine.runtime.backends.base import Population, PopulationOutput
from seedledger.ledger import Ledger, ReplayStep
from seedledger.ledger.errors import SeedLedgerError
from seedledger.replay import update
from seedledger.replay.adapter import start_fingerprint
from seedledger.replay.fingerprint import fingerprint
from seedledger.replay.noise import member_key
from seedledger.replay.rebuild import rebuild
from seedledger.trainers.fitness import Fitness, mean
from seedledger.trainers.member import Member
from seedledger.trainers.tasks import load_task


@dataclass(frozen=True)
class Batch:
    """The generation's training rows at the curriculum's level: built once per generation
    (`Evaluator.batch`, the pool's `batch`), scored by every member, recorded by index."""

    indices: list[int]
    rows: list[Any]
    level: int | None = None


@dataclass
class HeldOutScores:
    """One model's answers on held-out rows, row by row (`held_out_scores`): greedy
    completions, or for a module run (`greedy` False) none, its rows being seeds."""

    questions: list[str]
    completions: list[str]
    rewards: list[float | None]
    components: dict[str, list[float | None]]
    unit: str = "rows"  # what a row is, as the report names it (the task's `held_out_unit`)
    greedy: bool = True  # the rows were answered by greedy decoding

    def component_means(self) -> dict[str, float | None]:
        return {name: mean(values) for name, values in self.components.items()}


def generation_batch(task, cfg: TrainConfig, generation: int, level: int | None = None) -> Batch:
    """The generation's deterministic batch of `task`, at the curriculum's `level` if any:
    built once per generation, by the replica (local) or the driver (Ray)."""
    if level is not None:
        task.set_level(level)
    indices, rows = task.train_batch(cfg.seed, generation, cfg.batch_size)
    if cfg.exclude_rows:  # a counterfactual fork (`attribute --retrain`): the other rows stay
        kept = [(i, row) for i, row in zip(indices, rows, strict=True) if i not in set(cfg.exclude_rows)]
        if not kept:
            raise SeedLedgerError(f"generation {generation}: exclude_rows leaves none of its batch's rows {indices}")
        indices, rows = [i for i, _ in kept], [row for _, row in kept]
    return Batch(indices, rows, level)


class Evaluator:
    def __init__(self, cfg: TrainConfig, model_dir: Path, task: Any = None):
        """`task`: the config's task when the caller loaded it already (HeldOut checks its rows first)."""
        self.cfg = cfg
        self.backend = make_backend(cfg, model_dir)
        self.task = task if task is not None else load_task(cfg.task, seed=cfg.seed)
        self.master = self.backend.master()
        self.state = update.OptimizerState()
        self.generation = 0
        self.fitness = Fitness.of(cfg)

    def base_fingerprint(self) -> str:
        """Generation 0's fingerprint (call it before `restore`): the base model's, or an
        adapter run's frozen base as loaded together with its initial adapter."""
        return start_fingerprint(self.master, self.frozen)

    @property
    def frozen(self) -> str | None:
        """An adapter run's frozen base fingerprint (None: the master is the whole model)."""
        return getattr(self.backend, "frozen", None)

    def restore(self, ledger: Ledger, run: str, generation: int, anchors_dir: Path | None) -> str:
        """Bring the master to `run@generation` by replaying the ledger; returns its fingerprint."""
        if generation > 0:
            self.master, self.state = rebuild(
                ledger, run, generation, self.master, verify="end", anchors_dir=anchors_dir,
                frozen=self.frozen,
            )
        self.generation = generation
        self.backend.load_master(self.master)
        return fingerprint(self.master)

    def batch(self, generation: int, level: int | None = None) -> Batch:
        """The generation's deterministic batch, at the curriculum's `level` if any."""
        return generation_batch(self.task, self.cfg, generation, level)

    def score_population(
        self,
        members: list[Member],
        sigma: float,
        generation: int,
        run_key: int,
        level: int | None = None,
        on_member: Callable[[Member], None] | None = None,
        batch: Batch | None = None,
    ) -> list[Member]:
        """`members` (a contiguous run of the generation's population, starting at a group
        boundary) scored on the generation's `batch` (built here when not given, at `level`).

        The backend gets `members_per_forward` members at a time (the run's stored group
        size, so a member's rows always share a forward with the same rows whichever pool or
        worker evaluates it). Rewards are computed here, so only numbers leave a worker;
        `on_member` hears each scored member as its group ends."""
        if batch is None:
            batch = self.batch(generation, level)
        elif batch.level is not None:
            self.task.set_level(batch.level)
        if self.task.scores_models:  # a module run: no prompts, no decoding
            return self._score_models(members, sigma, batch, on_member)
        indices, rows = batch.indices, batch.rows
        prompts = [self.task.prompt(row) for row in rows]
        sampled = self.cfg.sampling.temperature > 0
        scored = []
        group = self.cfg.members_per_forward or 1  # stored with the run (engine.runtime.setup.batching)
        for start in range(0, len(members), group):
            chunk = members[start : start + group]
            population = Population(
                keys=tuple(m.key for m in chunk),
                signs=tuple(m.sign for m in chunk),
                sigma=sigma,
                seeds=tuple(
                    member_key(run_key, generation, 1_000_000 + m.index) if sampled else None
                    for m in chunk
                ),
                shrink=chunk[0].shrink,
                paths=tuple(m.paths for m in chunk) if any(m.paths for m in chunk) else (),
                state=self.state,
            )
            out = self._decode(population, prompts, self.fitness.samples)
            likelihoods, seconds = self._likelihoods(population, prompts, rows)
            seconds = {k: v / len(chunk) for k, v in {**out.seconds, **seconds}.items()}
            for m, completions in enumerate(out.completions):
                mine = {name: scores[m] for name, scores in likelihoods.items()}
                logprobs = out.logprobs[m] if out.logprobs is not None else None
                scored.append(self._score(chunk[m], prompts, rows, indices, completions, seconds, mine, logprobs))
                if on_member is not None:
                    on_member(scored[-1])
        return scored

    def _score_models(self, members: list[Member], sigma: float, batch: Batch,
                      on_member: Callable[[Member], None] | None) -> list[Member]:
        """A module run's members scored by its task (`fitness_task.ModelTask.score`) on
        their modules (`backends.module.ModuleBackend.members`): one at a time, or the
        whole group at once for a batched fitness."""
        together = len(members) if self.task.batched else 1
        scored = []
        for start in range(0, len(members), together):
            chunk = members[start : start + together]
            began = time.perf_counter()
            models = self.backend.members(self.master, chunk, sigma, self.state, together > 1)
            loaded = time.perf_counter()
            with torch.no_grad():  # a fitness reads the model; nothing here is differentiated
                rewards = self.task.score(models, batch.rows, [m.index for m in chunk])
            seconds = {
                "load_member": (loaded - began) / len(chunk), "score": (time.perf_counter() - loaded) / len(chunk),
            }
            for member, reward in zip(chunk, rewards, strict=True):
                scored.append(
                    member.scored(reward=reward, components={}, seconds=dict(seconds), sample_rewards=[reward])
                )
                if on_member is not None:
                    on_member(scored[-1])
        return scored

    def _decode(self, population: Population, prompts: list, samples: int) -> PopulationOutput:
        """The members' completions, or empty ones when every reward is a likelihood (no
        decoding at all: the reward needs none)."""
        if self.task.decodes:
            return self.backend.evaluate(self.master, population, prompts, self.cfg.max_new_tokens, samples=samples)
        return PopulationOutput([[""] * len(prompts) for _ in range(len(population))])

    def _likelihoods(
        self, population: Population, prompts: list, rows: list
    ) -> tuple[dict[str, list[list[float]]], dict[str, float]]:
        """Each likelihood reward's scores, per member and row (`trainers.rewards.loglik`)."""
        out, seconds = {}, {}
        for reward in self.task.likelihood_rewards:
            scored = self.backend.loglik(self.master, population, prompts, reward.references(rows))
            out[reward.name] = scored.scores
            for k, v in scored.seconds.items():
                seconds[k] = seconds.get(k, 0.0) + v
        return out, seconds

    def _score(
        self, member: Member, prompts: list, rows: list, indices: list[int], completions: list[str],
        seconds: dict[str, float], likelihoods: dict[str, list[float]] | None = None, logprobs: Any = None,
    ) -> Member:
        """`member` scored by `Fitness` from the task's rewards of its completions (one per
        sample, prompt-major), with its samples kept when the config asks."""
        prompts, rows, indices = (self.fitness.per_sample(x) for x in (prompts, rows, indices))
        rewards, components = self.task.reward(prompts, completions, rows, likelihoods)
        samples = None
        if self.cfg.keep_samples:
            samples = [
                {"row": i, "prompt": _prompt_text(p), "data": _public_columns(row, p),
                 "completion": c, "reward": r}
                for i, p, row, c, r in zip(indices, prompts, rows, completions, rewards, strict=True)
            ]
            if self.cfg.passk is not None:
                for j, sample in enumerate(samples):
                    sample["sample"] = j % self.cfg.passk.n
        return self.fitness.score(member, rewards, components, samples=samples, seconds=seconds, logprobs=logprobs)

    def apply(self, step: ReplayStep) -> str:
        """Apply one committed-to-be generation record; returns the new fingerprint."""
        update.apply_step(self.master, self.state, step)
        self.generation = step.index
        if self.backend.keeps_master:  # members ride on the loaded master: refresh it once
            self.backend.load_master(self.master)
        return fingerprint(self.master)

    def held_out_reward(self, limit: int) -> float:
        """Mean reward of the current master on the task's test split (greedy)."""
        return mean(self.held_out_rewards(limit)) or 0.0

    def held_out_rewards(self, limit: int, skip: int = 0) -> list[float | None]:
        """Per-row rewards of the current master on `limit` test rows after the first `skip`,
        so two models can be compared row by row."""
        return self.held_out_scores(limit, skip).rewards

    def held_out_scores(self, limit: int, skip: int = 0) -> HeldOutScores:
        """`held_out_rewards` with what `evaluate` prints beside them: each row's question,
        completion and reward components. Always greedy (temperature 0), whatever the
        training's `sampling`: held-out figures are deterministic and need no seed."""
        if self.task.scores_models:  # a module run: held-out seeds, no decoding
            return self._held_out_models(limit, skip)
        rows = self.task.test_rows()[skip : skip + limit]
        self.backend.load_master(self.master)
        prompts = [self.task.prompt(row) for row in rows]
        completions = self.backend.generate(
            prompts, self.cfg.max_new_tokens, seed=None, temperature=0.0
        )
        rewards, components = self.task.held_out_reward(prompts, completions, rows)
        return HeldOutScores([_prompt_text(p) for p in prompts], completions, rewards, components)

    def _held_out_models(self, limit: int, skip: int) -> HeldOutScores:
        """A module run's held-out scores: the master's module scored by the task on each
        held-out seed alone (`ModelTask.held_out`)."""
        seeds = self.task.held_out_seeds(skip, limit)
        self.backend.load_master(self.master)
        with torch.no_grad():  # a fitness reads the model, as in training
            rewards = self.task.held_out(self.backend.module, seeds)
        return HeldOutScores([f"seed {s}" for s in seeds], [""] * len(seeds), list(rewards), {},
                             unit=self.task.held_out_unit, greedy=False)


def _prompt_text(prompt: Any) -> str:
    """What the model was asked: the last message of a chat prompt (the question)."""
    if isinstance(prompt, list) and prompt and isinstance(prompt[-1], dict):
        return str(prompt[-1].get("content", ""))
    return str(prompt)


def _public_columns(row: dict[str, Any], prompt: Any) -> dict[str, Any]:
    """The row's dataset columns a reward compares against (the expected answer, ...), as
    JSON: internal `_` columns and the prompt's own text are left out."""
    text = _prompt_text(prompt)
    out = {}
    for key, value in row.items():
        if key.startswith("_") or value == text:
            continue
        if not isinstance(value, str | int | float | bool | type(None) | list):
            value = str(value)
        out[key] = value
    return out
