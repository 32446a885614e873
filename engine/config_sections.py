"""The config's sub-sections (workers, sampling, evaluation, curriculum, pass@k, KL) and
its bounds: engine.config assembles them, and the kind sections of engine.config_kinds,
into TrainConfig, which stays one readable list of top-level keys."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from seedledger.ledger.seedfile import MAX_GENERATIONS
from seedledger.trainers.requirements import BASE_LOGPROBS, MEMBER_TERMS
from seedledger.trainers.schedules import Schedule

# Bounds (issue 13 item 7): every number finite, and limits that cohere with what the
# ledger and a seed file can hold, so a config that cannot work is refused before any run
# exists. A seed file holds at most MAX_POPULATION members per generation, MAX_MEMBERS in
# all; σ and lr outside [MIN_SCALE, MAX_SCALE] are typos (1e308) or train nothing (1e-320
# rounds to 0); batch and token counts beyond these are memory bombs, not experiments.
MIN_SCALE, MAX_SCALE = 1e-12, 10.0
MAX_BATCH = 4096
MAX_NEW_TOKENS = 32768
MAX_WORKERS = 1024
MAX_ROWS = 1_000_000


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)


# What each pool can do (trainers.requirements' capabilities): a Ray worker's replica gets
# only keys and numbers, so members cannot carry terms along replay-state vectors there.
POOL_CAPABILITIES: dict[str, frozenset[str]] = {
    "local": frozenset({MEMBER_TERMS, BASE_LOGPROBS}),
    "ray": frozenset({BASE_LOGPROBS}),
}


class Workers(Strict):
    pool: Literal["local", "ray"] = Field(
        "local", description="`local`: members evaluated in this process; `ray`: on Ray actors"
    )
    count: int = Field(
        1, ge=1, le=MAX_WORKERS, description="Ray actors, one model replica each (pool: ray)"
    )
    address: str | None = Field(None, description="Ray cluster address; default $RAY_ADDRESS or local")
    gpus_per_worker: float = Field(
        1.0, gt=0.0, le=8.0,
        description="GPUs per Ray actor with device: cuda (1: one model replica per GPU; 0.5: two share one)",
    )

    @model_validator(mode="after")
    def _whole_gpus_above_one(self) -> Workers:
        if self.gpus_per_worker > 1 and not self.gpus_per_worker.is_integer():
            raise ValueError("workers.gpus_per_worker: above 1 it must be a whole number of GPUs (Ray's rule)")
        return self


class Schedules(Strict):
    lr: Schedule = Field(Schedule(), description="scales `lr` per generation")
    sigma: Schedule = Field(Schedule(), description="scales `sigma` per generation")


class Sampling(Strict):
    temperature: float = Field(0.0, ge=0.0, le=100.0, description="0 = greedy")
    top_p: float = Field(1.0, gt=0.0, le=1.0, description="nucleus sampling's mass; 1 = off")
    kv_cache: Literal["dynamic", "static"] = Field(
        "dynamic", description="the hf backend's KV cache for every decode (training and held-out): `static` "
        "preallocates it, so that on CUDA transformers compiles the decode step into CUDA graphs"
    )


class CurriculumConfig(Strict):
    """Move the task's difficulty level by the recent success rate (trainers.rewards.curriculum)."""

    window: int = Field(5, ge=1, le=MAX_GENERATIONS, description="generations averaged before a change")
    raise_above: float = Field(
        0.7, ge=0.0, le=1.0,
        description="raise the level when the window's mean success rate exceeds this",
    )
    lower_below: float = Field(
        0.2, ge=0.0, le=1.0,
        description="lower the level when the window's mean success rate is below this",
    )
    threshold: float = Field(1.0, description="a sample counts as a success at reward >= this")

    @model_validator(mode="after")
    def _bounds_in_order(self) -> CurriculumConfig:
        if not self.lower_below < self.raise_above:
            raise ValueError(
                f"lower_below ({self.lower_below}) must be below raise_above ({self.raise_above})"
            )
        return self


class PassKConfig(Strict):
    """pass@k training: `n` seeded samples per prompt per member; the member's reward is the
    mean over prompts of the unbiased pass@k estimate (trainers.rewards.passk)."""

    n: int = Field(4, ge=1, le=256, description="samples per prompt")
    k: int = Field(1, ge=1, description="pass@k's k, 1 <= k <= n")
    threshold: float | None = Field(
        None,
        description="a sample succeeds at reward >= this; default: curriculum.threshold if a "
        "curriculum is set, else 1.0",
    )

    @model_validator(mode="after")
    def _k_within_n(self) -> PassKConfig:
        if not self.k <= self.n:
            raise ValueError(f"k ({self.k}) must be at most n ({self.n})")
        return self


DEFAULT_EVALUATION_ROWS = 64  # `evaluation.rows` left out: this many test rows, or all of fewer


class Evaluation(Strict):
    """Held-out evaluation (`evaluate`, the demo) decodes greedily whatever `sampling` says,
    so its figures are deterministic and comparable between runs."""

    rows: int | None = Field(
        None, ge=1, le=MAX_ROWS, description="held-out rows scored by `evaluate` and `evaluation.every`; "
        f"default: the task's test rows, at most {DEFAULT_EVALUATION_ROWS}",
    )
    every: int | None = Field(
        None, ge=1, description="during training, score the held-out rows every K generations "
        "and at the session's end (`evaluation` events; never used by the update)",
    )


class KLConfig(Strict):
    """reward − β·KL(member ‖ base) from each completion's token log-probabilities under
    the member and the frozen base model (trainers.rewards.kl)."""

    beta: float = Field(0.05, ge=0.0, le=100.0, allow_inf_nan=False, description="β, or its start when adapted")
    estimator: Literal["k1", "k3"] = Field(
        "k3", description="per-token estimate: k1 = log π − log π₀, or k3 = (ρ − 1) − log ρ with "
        "ρ = π₀/π (never negative, lower variance)"
    )
    target: float | None = Field(
        None, gt=0.0, allow_inf_nan=False,
        description="a KL per completion to steer β toward (adaptive controller); none: β fixed",
    )
    horizon: float = Field(10_000.0, gt=0.0, allow_inf_nan=False, description="completions over which β may move ~20%")
