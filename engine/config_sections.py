"""The config's sub-sections (workers, sampling, evaluation, curriculum, pass@k, KL,
low-rank noise, LoRA training) and its bounds: engine.config assembles them into
TrainConfig, which stays one readable list of top-level keys."""

from __future__ import annotations

from typing import Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from seedledger.ledger.seedfile import MAX_GENERATIONS
from seedledger.replay.adapter import LoraSpec
from seedledger.replay.kinds import (
    DEFAULT_TARGETS,
    Adapter,
    Int8Kind,
    PerturbationKind,
    QuantCodes,
    QuantScales,
)
from seedledger.replay.kinds import LowRank as LowRankKind
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


class Schedules(Strict):
    lr: Schedule = Field(Schedule(), description="scales `lr` per generation")
    sigma: Schedule = Field(Schedule(), description="scales `sigma` per generation")


class Sampling(Strict):
    temperature: float = Field(0.0, ge=0.0, le=100.0, description="0 = greedy")
    top_p: float = Field(1.0, gt=0.0, le=1.0, description="nucleus sampling's mass; 1 = off")


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


class LowRank(Strict):
    """EGGROLL-style perturbations E = A·Bᵀ/√rank of the targeted linear layers only
    (replay.perturbation); every other parameter stays frozen."""

    kind_type: ClassVar[type[PerturbationKind]] = LowRankKind

    kind: Literal["lowrank"] = Field("lowrank", description="selects low-rank noise")
    rank: Literal[1, 4, 16, 64] = Field(1, description="a power of 4, so 1/√rank is exact")
    targets: list[str] = Field(
        list(DEFAULT_TARGETS), min_length=1,
        description="suffixes of the linear layers perturbed and trained (`<suffix>.weight`)",
    )

    def perturbation_kind(self) -> PerturbationKind:
        """The replay-side kind this section names (replay.kinds.lowrank)."""
        return LowRankKind.of(self.rank, self.targets)


# The sections that name a perturbation kind besides "full" (engine.config's `perturbation`):
# each builds its replay kind with `perturbation_kind()`; a new kind adds its section here.
PerturbationSection = LowRank


class LoraTrain(Strict):
    """Train a LoRA adapter on the frozen base instead of every weight (replay.adapter).
    Unset fields are filled in when the run is created (engine.runtime.adapters.resolve) and
    stored with it: rank 8, alpha 16, every attention and MLP projection, A from the
    run's seed and B = 0, or all of them from the PEFT adapter directory `init`."""

    kind_type: ClassVar[type[PerturbationKind]] = Adapter

    kind: Literal["lora"] = Field("lora", description="selects a LoRA adapter on the frozen base")
    rank: int | None = Field(
        None, ge=1, le=4096, description="the adapter's rank r (default: `init`'s, else 8)"
    )
    alpha: float | None = Field(None, gt=0.0, description="the model adds (alpha/rank)·B·A")
    target_modules: list[str] | None = Field(None, min_length=1, description="linear-module name suffixes")
    init: str | None = Field(None, description="a PEFT adapter directory to start from (SFT warm start)")
    init_seed: int | None = Field(None, ge=0, lt=2**63, description="seed of the initial A (default: `seed`)")
    init_fingerprint: str | None = Field(None, description="the fingerprint of `init`'s tensors")
    essa: bool = Field(False, description="train only the singular values of `init`'s B·A (ESSA, "
                                          "arXiv 2507.04453): U and V stay fixed")

    @model_validator(mode="after")
    def _essa_needs_init(self) -> LoraTrain:
        if self.essa and self.init is None:
            raise ValueError("train.essa trains the singular values of an SFT adapter: name its PEFT "
                             "directory in train.init")
        return self

    def spec(self) -> LoraSpec:
        if self.rank is None or self.alpha is None or self.target_modules is None:
            raise ValueError("an adapter run's train block is resolved when the run is created")
        init = f"seed:{self.init_seed}" if self.init is None else f"peft:{self.init_fingerprint}"
        return LoraSpec(self.rank, self.alpha, tuple(self.target_modules), init, self.essa)

    def perturbation_kind(self) -> PerturbationKind:
        """The replay-side kind this section names (replay.kinds.adapter; resolved fields only)."""
        return Adapter(self.spec())

    def dtype_policy(self, dtype: str, base_quantization: str) -> str:
        """The run's `dtype_policy`: an fp32 adapter on the (maybe int8) frozen base."""
        return f"fp32-adapter/{base_quantization}-base/{dtype}-eval"

    def refusal(self, base_quantization: str, backend: str) -> str | None:
        """Why this run cannot go as configured (one line), else None."""
        if base_quantization != "none" and backend == "vllm":
            return (f"base_quantization {base_quantization}: the vllm backend serves the frozen base "
                    "as stored; use backend: hf")
        return None


class Int8Train(Strict):
    """What the int8 sections share (replay.kinds.quant_scales.Int8Kind; docs/quantized.md):
    the run starts from the fp32 base and its first generation quantizes the targeted
    linears (symmetric, per output row); the kind says what moves from then on."""

    kind_type: ClassVar[type[Int8Kind]]
    hf_only: ClassVar[str]  # why the run needs the hf backend (`refusal`)
    other_backends: ClassVar[tuple[str, ...]] = ("vllm",)  # the backends refused

    targets: list[str]

    def perturbation_kind(self) -> PerturbationKind:
        """The replay-side kind this section names (replay.kinds)."""
        return self.kind_type.of(self.targets)

    def refusal(self, base_quantization: str, backend: str) -> str | None:
        """Why this run cannot go as configured (one line), else None."""
        if base_quantization != "none":
            return (f"base_quantization {base_quantization}: a {self.kind_type.name} run quantizes the base "
                    "itself (int8 codes, fp32 scales); drop base_quantization")
        if backend in self.other_backends:
            return f"train: {self.kind_type.name} runs on the hf backend ({self.hf_only}); use backend: hf"
        return None


class QuantScalesTrain(Int8Train):
    """ES over the per-row scales of an int8 weight-only model, its integer codes frozen
    (replay.kinds.quant_scales; docs/quantized.md). The run starts from the fp32 base; its
    first generation quantizes the targeted linears (symmetric, per output row) and from
    then on only their scales move. σ is on the scales' own scale (about absmax/127)."""

    kind_type: ClassVar[type[Int8Kind]] = QuantScales
    hf_only: ClassVar[str] = "its members scale the shared matmul's rows"

    kind: Literal["quant_scales"] = Field(
        "quant_scales", description="selects ES over an int8 model's per-row scales"
    )
    targets: list[str] = Field(
        list(DEFAULT_TARGETS), min_length=1,
        description="suffixes of the linear layers quantized to int8, whose scales are trained",
    )

    def dtype_policy(self, dtype: str, base_quantization: str) -> str:
        """The run's `dtype_policy`: fp32 scales beside the frozen int8 codes."""
        return f"fp32-scales/int8-codes/{dtype}-eval"


class QuantCodesTrain(Int8Train):
    """ES over the int8 codes themselves, QES-style (replay.kinds.quant_codes; docs/quantized.md):
    the first generation quantizes the targeted linears; members perturb the dequantized
    weights (σ in weight units, as a full run), the update gathers in an fp32 residual and a
    code moves by a step once its residual passes half a step. Scales stay frozen."""

    kind_type: ClassVar[type[Int8Kind]] = QuantCodes
    hf_only: ClassVar[str] = "its members are the dequantized weights plus noise"
    other_backends: ClassVar[tuple[str, ...]] = ("vllm", "module")

    kind: Literal["quant_codes"] = Field(
        "quant_codes", description="selects ES over an int8 model's integer codes"
    )
    targets: list[str] = Field(
        list(DEFAULT_TARGETS), min_length=1,
        description="suffixes of the linear layers quantized to int8, whose codes are trained",
    )

    def dtype_policy(self, dtype: str, base_quantization: str) -> str:
        """The run's `dtype_policy`: int8 codes (an fp32 residual) beside frozen fp32 scales."""
        return f"int8-codes/fp32-scales/{dtype}-eval"


def shorthand(kinds: tuple[str, ...]):
    """`perturbation: lowrank`, `train: lora` (or `train: quant_scales`) and `--set
    perturbation.rank=4` / `--set train.rank=8` (which arrive as {name: full, rank: ...})
    mean the obvious thing: settings given to the plain kind ask for the first other."""
    plain, other, *more = kinds

    def parse(value: Any) -> Any:
        if isinstance(value, str) and value not in kinds:
            raise ValueError(f"{value!r} is not one of {', '.join(kinds)} or {{kind: {other}, ...}}")
        if isinstance(value, str) and value != plain:
            return {"kind": value}
        if isinstance(value, dict) and value.get("kind") in more:
            return _checked(SECTIONS[value["kind"]], value)
        if isinstance(value, dict) and "name" in value and "kind" not in value:
            value = {("kind" if k == "name" else k): v for k, v in value.items()}
            if value["kind"] == plain and set(value) - {"kind"}:
                value["kind"] = other  # settings given to the plain kind ask for the other
        if isinstance(value, dict) and value.get("kind") == plain and set(value) == {"kind"}:
            return plain
        return value

    return parse


def _checked(section: type[Strict], value: dict) -> Strict:
    """`value` validated as `section` alone, so that its errors are not mixed with another
    section's (a union reports every branch): ValueError naming the key."""
    try:
        return section.model_validate(value)
    except ValidationError as exc:
        err = exc.errors()[0]
        where = ".".join(str(p) for p in err["loc"])
        why = "unknown key" if err["type"] == "extra_forbidden" else err["msg"].removeprefix("Value error, ")
        raise ValueError(f"{where}: {why}" if where else why) from None


# The sections `train:` accepts besides "full", and the bare words that stand for one: a new
# trained-parameter kind adds its section here (engine.config names only these two). Kinds
# after the first are validated by their own section (`shorthand`, `SECTIONS`).
TrainSection = LoraTrain | QuantScalesTrain | QuantCodesTrain
TRAIN_SHORTHANDS = ("full", "lora", "quant_scales", "quant_codes")
SECTIONS: dict[str, type[Strict]] = {"quant_scales": QuantScalesTrain, "quant_codes": QuantCodesTrain}
