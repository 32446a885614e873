"""One model replica: its fp32 master, optimizer state, backend and task.

The local pool holds one of these in process; each Ray actor holds its own. Everything
that changes the master goes through `apply`, which calls replay's update: training and
replay share one code path (DESIGN.md invariant 2).

Decoding. Training follows `sampling`: greedy at temperature 0, else seeded sampling with
the member's seed `member_key(run_key, generation, 1_000_000 + member)`, which the
backend splits per prompt (batch position) and per sample. Held-out evaluation is always
greedy, whatever `sampling` says, so its figures are deterministic and comparable.

pass@k (`passk: {n, k}`): each prompt is sampled n times (sample s of prompt i seeded by
(member seed, i, s); sample 0 is the plain sampling's draw), every sample is scored by
the task, and a sample succeeds at reward >= the success threshold (`passk.threshold`,
else `curriculum.threshold`, else 1.0). The member's reward is the mean over the batch's
prompts of the unbiased pass@k estimate with c = that prompt's successes. Its components
are each reward function's mean over all samples, plus `pass@k` (the reward itself) and
`sample_reward` (the mean combined reward of a sample).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from engine.backends import make_backend
from engine.config import TrainConfig
from ledger import Ledger, ReplayStep
from replay import update
from replay.fingerprint import fingerprint
from replay.noise import member_key
from replay.rebuild import rebuild
from trainers.es import Member
from trainers.rewards.curriculum import success_rate
from trainers.rewards.passk import pass_at_k_rewards
from trainers.tasks import load_task


@dataclass
class MemberResult:
    reward: float
    components: dict[str, float | None]
    samples: list[dict[str, Any]] | None = field(default=None)
    seconds: dict[str, float] = field(default_factory=dict)
    success: float = 0.0  # share of the batch's samples at reward >= the curriculum threshold


def _mean(values: list[float | None]) -> float | None:
    kept = [v for v in values if v is not None]
    return sum(kept) / len(kept) if kept else None


class Evaluator:
    def __init__(self, cfg: TrainConfig, model_dir: Path):
        self.cfg = cfg
        self.backend = make_backend(cfg, model_dir)
        self.task = load_task(cfg.task, seed=cfg.seed)
        self.master = self.backend.master()
        self.state = update.OptimizerState()
        self.generation = 0
        self._threshold = cfg.curriculum.threshold if cfg.curriculum else 1.0
        self._passk_threshold = self._threshold
        if cfg.passk is not None and cfg.passk.threshold is not None:
            self._passk_threshold = cfg.passk.threshold

    def base_fingerprint(self) -> str:
        return fingerprint(self.master)

    def restore(self, ledger: Ledger, run: str, generation: int, anchors_dir: Path | None) -> str:
        """Bring the master to `run@generation` by replaying the ledger; returns its fingerprint."""
        if generation > 0:
            self.master, self.state = rebuild(
                ledger, run, generation, self.master, verify="end", anchors_dir=anchors_dir
            )
        self.generation = generation
        self.backend.load_master(self.master)
        return fingerprint(self.master)

    def score(
        self, member: Member, sigma: float, generation: int, run_key: int, level: int | None = None
    ) -> MemberResult:
        """Evaluate one member on the generation's batch (at the curriculum's `level`, if any);
        rewards are computed here, so only numbers leave a worker."""
        if level is not None:
            self.task.set_level(level)
        indices, rows = self.task.train_batch(self.cfg.seed, generation, self.cfg.batch_size)
        started = time.perf_counter()
        self.backend.load_member(self.master, member.key, member.sign, sigma)
        loaded = time.perf_counter()
        prompts = [self.task.prompt(row) for row in rows]
        seed = None
        if self.cfg.sampling.temperature > 0:
            seed = member_key(run_key, generation, 1_000_000 + member.index)
        passk = self.cfg.passk
        if passk is None:
            completions = self.backend.generate(prompts, self.cfg.max_new_tokens, seed=seed)
        else:  # n samples per prompt, prompt-major
            completions = self.backend.generate(
                prompts, self.cfg.max_new_tokens, seed=seed, samples=passk.n
            )
            prompts = [p for p in prompts for _ in range(passk.n)]
            rows = [r for r in rows for _ in range(passk.n)]
            indices = [i for i in indices for _ in range(passk.n)]
        generated = time.perf_counter()
        rewards, components = self.task.reward(prompts, completions, rows)
        scores = [0.0 if r is None else r for r in rewards]
        samples = None
        if self.cfg.keep_samples:
            samples = [
                {"row": i, "completion": c, "reward": r}
                for i, c, r in zip(indices, completions, rewards, strict=True)
            ]
            if passk is not None:
                for j, sample in enumerate(samples):
                    sample["sample"] = j % passk.n
        means = {name: _mean(vals) for name, vals in components.items()}
        reward = _mean(rewards) or 0.0
        if passk is not None:
            per_prompt = pass_at_k_rewards(scores, passk.n, passk.k, self._passk_threshold)[:: passk.n]
            means["sample_reward"] = reward
            reward = sum(per_prompt) / len(per_prompt)
            means[f"pass@{passk.k}"] = reward
        return MemberResult(
            reward=reward,
            components=means,
            samples=samples,
            seconds={"load_member": loaded - started, "generate": generated - loaded},
            success=success_rate(scores, self._threshold),
        )

    def apply(self, step: ReplayStep) -> str:
        """Apply one committed-to-be generation record; returns the new fingerprint."""
        update.apply_step(self.master, self.state, step)
        self.generation = step.index
        return fingerprint(self.master)

    def held_out_reward(self, limit: int) -> float:
        """Mean reward of the current master on the task's test split (greedy)."""
        return _mean(self.held_out_rewards(limit)) or 0.0

    def held_out_rewards(self, limit: int) -> list[float | None]:
        """Per-row rewards of the current master on the first `limit` test rows, so two
        models can be compared row by row. Always greedy (temperature 0), whatever the
        training's `sampling`: held-out figures are deterministic and need no seed."""
        rows = self.task.test_rows()[:limit]
        self.backend.load_master(self.master)
        prompts = [self.task.prompt(row) for row in rows]
        completions = self.backend.generate(
            prompts, self.cfg.max_new_tokens, seed=None, temperature=0.0
        )
        rewards, _ = self.task.reward(prompts, completions, rows)
        return rewards
