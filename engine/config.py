"""Training configuration: YAML validated by pydantic, `--set key=value` overrides.

Unknown keys and bad values are bad input: `load_config` raises SeedLedgerError naming
the field and the reason (engine.config_errors). The resolved config (defaults filled in)
is stored in the run, so a resume or fork never depends on this file's defaults changing
later. The sub-sections and bounds live in engine.config_sections and are re-exported here.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import BeforeValidator, Field, NonNegativeInt, ValidationError, field_validator, model_validator
from pydantic_core import PydanticCustomError

from seedledger.engine import config_kinds
from seedledger.engine.config_backends import BACKEND_CAPABILITIES, decoding_refusal
from seedledger.engine.config_errors import report
from seedledger.engine.config_kinds import SECTIONS, LoraTrain, LowRank, Section, shorthand
from seedledger.engine.config_paths import absolute_refs
from seedledger.engine.config_sections import (
    MAX_BATCH,
    MAX_NEW_TOKENS,
    MAX_ROWS,
    MAX_SCALE,
    MAX_WORKERS,
    MIN_SCALE,
    POOL_CAPABILITIES,
    CurriculumConfig,
    Evaluation,
    KLConfig,
    PassKConfig,
    Sampling,
    Schedules,
    Strict,
    Workers,
)
from seedledger.ledger.errors import SeedLedgerError
from seedledger.ledger.seedfile import MAX_GENERATIONS, MAX_MEMBERS, MAX_POPULATION
from seedledger.replay.kinds import Full, PerturbationKind
from seedledger.trainers.adaptation import AdaptationSpec
from seedledger.trainers.cmaes import CMAESSpec
from seedledger.trainers.ga import GASpec
from seedledger.trainers.lmmaes import LMMAESSpec
from seedledger.trainers.optim import OptimizerSpec
from seedledger.trainers.policy import check_config
from seedledger.trainers.tasks.bounds import check_task_settings
from seedledger.trainers.tasks.registry import (
    UnknownTaskOption,
    check_options,
    check_rewards,
    is_model_task,
    task_levels,
    uses_loglik,
)

__all__ = [
    "MAX_BATCH", "MAX_NEW_TOKENS", "MAX_ROWS", "MAX_SCALE", "MAX_WORKERS", "MIN_SCALE", "CurriculumConfig",
    "Evaluation", "KLConfig", "LoraTrain", "LowRank", "PassKConfig", "Sampling", "Schedules", "Strict",
    "TrainConfig", "Workers", "apply_overrides", "load_config", "validate",
]


MODULE_MODELS = ("module:", "in-process:")  # engine.runtime.models.module: a torch.nn.Module by code


def is_module_model(ref: Any) -> bool:
    """Whether a config's `model` names a torch.nn.Module (not a Hugging Face model)."""
    return isinstance(ref, str) and ref.startswith(MODULE_MODELS)


class TrainConfig(Strict):
    model: str = Field(
        "smollm2-135m-instruct", description="an alias (`smollm2-135m-instruct`, `tiny`), a local "
        "Hugging Face directory, or a torch.nn.Module by code (`module:pkg.mod:factory`)"
    )
    algorithm: Literal["es", "ga", "cmaes", "lmmaes"] = Field(
        "es", description="the policy (trainers.policy.ALGORITHMS)"
    )
    ga: GASpec | None = Field(None, description="the GA's settings (algorithm: ga; trainers.ga)")
    cmaes: CMAESSpec | None = Field(None, description="CMA-ES settings (algorithm: cmaes; trainers.cmaes)")
    lmmaes: LMMAESSpec | None = Field(None, description="LM-MA-ES settings (algorithm: lmmaes; trainers.lmmaes)")
    task: str | dict[str, Any] = Field(
        "arithmetic", description="what members are scored on: a name (`arithmetic`, `jsonl:PATH`, "
        "...), a mapping with its options and `rewards`, or a `mix`"
    )
    population: int = Field(8, ge=1, le=MAX_POPULATION, description="at most what a seed file holds")
    mirrored: bool = Field(
        True, description="antithetic pairs: members w ± σε share one key (population even)"
    )
    sigma: float = Field(1e-3, gt=0.0, le=MAX_SCALE, description="noise scale: a member is w + σ·ε")
    lr: float = Field(5e-4, gt=0.0, le=MAX_SCALE, description="learning rate α of the es update "
                      "(cmaes and lmmaes step by their `cm`, a GA by 1)")
    optimizer: OptimizerSpec = Field(
        OptimizerSpec(), description="the update rule applied to the gradient estimate"
    )
    schedule: Schedules = Field(Schedules(), description="per-generation multipliers of lr and σ")
    adaptation: AdaptationSpec | None = Field(
        None, description="adapt σ (and lr) during the run from the rewards (trainers.adaptation)"
    )
    shaping: Literal["zscore", "centered_rank", "difference", "pareto"] = Field(
        "zscore", description="rewards to member weights: (r − mean)/std, centred ranks in "
        "[−0.5, 0.5], (r − mean)/σ, or NSGA-II ranks of the reward components"
    )
    generations: int = Field(10, ge=0, le=MAX_GENERATIONS, description="the run's target "
                             "generation (schedules span it; resume and fork continue towards it)")
    batch_size: int = Field(16, ge=1, le=MAX_BATCH, description="training rows per generation, "
                            "the same rows for every member")
    max_new_tokens: int = Field(
        32, ge=1, le=MAX_NEW_TOKENS, description="at most this many tokens per completion"
    )
    sampling: Sampling = Field(
        Sampling(), description="how training completions are decoded (seeded per member)"
    )
    seed: int = Field(
        0, ge=0, lt=2**63, description="the run key (noise, batches, sampling) derives from it"
    )
    backend: Literal["auto", "hf", "vllm", "module"] = Field(
        "auto", description="vllm where installed and able and the run has 5 generations or more, else hf: "
        "chosen when the run is created (engine.runtime.backends.choice); `module` for a torch.nn.Module model "
        "(set by `model: module:...`)"
    )
    device: str = Field(
        "cpu", description="torch device that evaluates members (`cpu`, `cuda`, `cuda:N`)"
    )
    dtype: Literal["float32", "bfloat16", "float16"] = Field(
        "float32", description="dtype members are evaluated in; the master stays fp32"
    )
    workers: Workers = Field(
        Workers(), description="where members are evaluated: in process or on Ray workers"
    )
    anchor_every: int = Field(0, ge=0, le=MAX_GENERATIONS, description="save an anchor every K generations; 0 = never")
    report_to: list[Literal["tensorboard", "mlflow", "wandb"]] = Field(
        [], description="experiment trackers that mirror the metrics (the ledger stays the record)"
    )
    keep_samples: bool = Field(False, description="store every completion in the ledger (audit)")
    row_scores: bool = Field(True, description="keep each member's score on each batch row (`attribute` drops rows)")
    exclude_rows: list[NonNegativeInt] = Field([], max_length=MAX_BATCH, description="train-pool rows no batch takes")
    evaluation: Evaluation = Field(Evaluation(), description="held-out scoring, decoded greedily")
    curriculum: CurriculumConfig | None = Field(
        None, description="move the task level by the success rate; none: a fixed level"
    )
    passk: PassKConfig | None = Field(None, description="pass@k rewards over n samples; none: off")
    train: Annotated[Literal["full"] | Section, BeforeValidator(shorthand(SECTIONS))] = Field(
        "full", description="what the run trains, so how its members differ: every weight (`full`, full-rank "
        "noise), the targeted linears by low-rank noise (`lowrank`), a LoRA adapter on the frozen base (`lora`), "
        "an int8 model's scales or codes (`quant_scales`, `quant_codes`); `perturbation:` is its older name"
    )
    base_quantization: Literal["none", "int8"] = Field(
        "none", description="an adapter run's frozen base: as stored, or int8 weight-only (torchao)"
    )
    kl: KLConfig | None = Field(None, description="reward − β·KL(member ‖ base); none: no penalty")
    members_per_forward: int | None = Field(
        None, ge=1, le=MAX_POPULATION,
        description="members evaluated together in one batched forward (low-rank); omitted: "
        "chosen when the run is created (engine.runtime.setup.batching) and stored with it",
    )

    @field_validator("task")
    @classmethod
    def _task_options_are_valid(cls, task: Any) -> Any:
        """Task and reward options are config too: a typo is found now, not at the first
        generation (a task option's error names its key, `task.test_sise`)."""
        try:
            check_options(task)
        except UnknownTaskOption as exc:
            raise PydanticCustomError("task_option", "{reason}",
                                      {"reason": str(exc), "key_path": exc.key_path}) from None
        try:
            check_rewards(task)
            check_task_settings(task)  # sizes and sandbox limits: bounded before any data is built
        except SeedLedgerError as exc:
            raise ValueError(str(exc)) from None
        return task

    @model_validator(mode="before")
    @classmethod
    def _one_key(cls, data: Any) -> Any:
        """`train:` names the run's kind; the older `perturbation:` (full, lowrank) reads as
        it, so configs stored with it resume, fork and rebuild, while a new run stores one key."""
        data = config_kinds.one_key(data)
        if isinstance(data, dict) and config_kinds.ALIAS in data:
            raise ValueError(config_kinds.alias_refusal(data))
        return data

    @model_validator(mode="before")
    @classmethod
    def _module_backend(cls, data: Any) -> Any:
        """`model: module:...` / `in-process:...` (any torch.nn.Module) runs on the module
        backend: `auto` (the default) means it, so the stored config names it."""
        if isinstance(data, dict) and is_module_model(data.get("model")) and data.get("backend", "auto") == "auto":
            data = {**data, "backend": "module"}
        return data

    @model_validator(mode="after")
    def _module_settings(self) -> TrainConfig:
        """A module run scores whole modules with a model task (gym:, fitness:), and the
        language-model settings do not apply to it; an LLM run takes neither."""
        module, scores_models = self.backend == "module", is_model_task(self.task)
        if module != is_module_model(self.model):
            raise ValueError(f"backend {self.backend} cannot run model {self.model!r}: a torch.nn.Module is named "
                             "`module:pkg.mod:factory` and runs on backend module, a language model on auto, hf "
                             "or vllm")
        if module != scores_models:
            raise ValueError("a torch.nn.Module model is scored by task gym:ENV_ID or fitness:pkg.mod:function, "
                             "and those tasks score only such a model" if module else
                             f"task {_task_name(self.task)} scores a torch.nn.Module: name one in `model` "
                             "(module:pkg.mod:factory)")
        if module:
            if not self.on_weights():
                raise ValueError(f"train: {self.perturbation_type().label} does not apply to a torch.nn.Module run "
                                 "(its own weights train: full or lowrank)")
            for key, off in (("kl", None), ("passk", None), ("curriculum", None), ("base_quantization", "none")):
                if getattr(self, key) != off:
                    raise ValueError(f"{key}: does not apply to a torch.nn.Module run")
            if self.workers.pool == "ray" and "in-process:" in f"{self.model} {self.task}":
                raise ValueError("workers.pool ray: Ray workers import the model and fitness by name; objects "
                                 "handed to seedledger.evolve in this process (in-process:) do not reach them")
            if self.keep_samples:
                raise ValueError("keep_samples keeps completions: it does not apply to a torch.nn.Module run")
        return self

    @model_validator(mode="after")
    def _fits(self) -> TrainConfig:
        """What the algorithm, the KL penalty and σ adaptation need of the backend, pool,
        perturbation kind and settings: declared on their classes, checked in one place."""
        refusal = check_config(self)
        if refusal is not None:
            raise ValueError(refusal)
        return self

    def perturbation_spec(self) -> PerturbationKind:
        """The replay-side kind `train` names."""
        return Full() if self.train == "full" else self.train.perturbation_kind()

    def on_weights(self) -> bool:
        """Whether the run's master is the model's own fp32 weights (`full`, `lowrank`), among
        whose kinds a fork may switch; else it is the kind's own state (an adapter, int8
        codes or scales), fixed for the lineage (KindSection.on_weights)."""
        return self.train == "full" or self.train.on_weights

    def same_master(self, other: TrainConfig) -> bool:
        """Whether `other` (a fork's child, a compared run) trains the same master: the same
        section, or the model's own weights both."""
        return self.train == other.train or (self.on_weights() and other.on_weights())

    def capabilities(self) -> frozenset[str]:
        """What both the run's backend and its pool can do (what algorithms may require)."""
        return BACKEND_CAPABILITIES[self.backend] & POOL_CAPABILITIES[self.workers.pool]

    def perturbation_type(self) -> type[PerturbationKind]:
        """The kind's class, readable before an adapter's train block is resolved (messages)."""
        return Full if self.train == "full" else self.train.kind_type

    @field_validator("sigma", "lr")
    @classmethod
    def _not_vanishing(cls, value: float) -> float:
        if value < MIN_SCALE:
            raise ValueError(f"{value!r} is below {MIN_SCALE}: so small a value trains nothing")
        return value

    @model_validator(mode="after")
    def _exportable(self) -> TrainConfig:
        if self.population * self.generations > MAX_MEMBERS:
            raise ValueError(
                f"population × generations = {self.population * self.generations:,} members, more "
                f"than a seed file holds ({MAX_MEMBERS:,}): such a run could not be exported"
            )
        return self

    @model_validator(mode="after")
    def _backend_fits(self) -> TrainConfig:
        """What the backend must build: the kind's members (with `base_quantization`) and its decoding."""
        why = (config_kinds.kind_refusal(self.train, self.backend, self.base_quantization)
               or decoding_refusal(self.backend, self.sampling.kv_cache))
        if why:
            raise ValueError(why)
        return self

    @model_validator(mode="after")
    def _curriculum_needs_levels(self) -> TrainConfig:
        if self.curriculum is not None and task_levels(self.task) < 2:
            raise ValueError(
                f"curriculum: task {_task_name(self.task)} has a single difficulty level, so "
                "there is nothing to move; use a generated task with levels (arithmetic, "
                "countdown) or drop `curriculum`"
            )
        return self

    @model_validator(mode="after")
    def _loglik_settings(self) -> TrainConfig:
        some, only = uses_loglik(self.task)
        if some and self.passk is not None:
            raise ValueError("rewards: loglik scores one reference answer per row; passk needs sampled ones")
        if only and self.kl is not None:
            raise ValueError("kl: the penalty scores decoded completions, and with only loglik rewards none "
                             "are decoded")
        return self

    @model_validator(mode="after")
    def _passk_needs_sampling(self) -> TrainConfig:
        if self.passk is not None and self.sampling.temperature <= 0:
            raise ValueError(
                "passk: needs sampling.temperature > 0 (greedy decoding gives n identical samples)"
            )
        return self


def _task_name(spec: Any) -> str:
    if isinstance(spec, dict):
        return "mix" if "mix" in spec else repr(spec.get("name"))
    return "mix" if isinstance(spec, list) else repr(spec)


def _parse_scalar(text: str) -> Any:
    """`--set` values are YAML scalars or flow collections: 1e-3, true, [a, b], {name: adam}."""
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError:
        return text


def apply_overrides(data: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    """`data` with each `--set key=value` written in; `train:` is the key that names the
    kind, and a `--set perturbation...` (its older name) applies as it always did."""
    data = config_kinds.one_key(data)
    for item in overrides:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise SeedLedgerError(f"--set expects key=value, got {item!r}")
        alias = key.partition(".")[0] == config_kinds.ALIAS
        if alias:
            data = config_kinds.older_form(data)
        node = data
        parts = key.split(".")
        for part in parts[:-1]:
            child = node.get(part)
            if not isinstance(child, dict):
                child = {} if child is None else {"name": child}
                node[part] = child
            node = child
        node[parts[-1]] = _parse_scalar(value)
        if alias:
            data = config_kinds.one_key(data)
    return data


def validate(
    data: dict[str, Any], source: str = "config", base_dir: str | Path | None = None,
    overrides: Sequence[str] = (),
) -> TrainConfig:
    """The validated config. Relative dataset and reward-file paths in `task` are made
    absolute against `base_dir` (default: the working directory), so the config stored
    with a run loads the same files from wherever it is resumed. Every error is reported
    (one line), each blamed on the `--set` in `overrides` that wrote the key, else on
    `source`."""
    data = absolute_refs(data, base_dir or Path.cwd())
    try:
        return TrainConfig.model_validate(data)
    except ValidationError as exc:
        raise SeedLedgerError(report(exc.errors(), source, overrides, TrainConfig)) from None


def load_config(path: str | Path | None, overrides: list[str] = ()) -> TrainConfig:
    data: dict[str, Any] = {}
    source = "config"
    if path is not None:
        source = str(path)
        try:
            loaded = yaml.safe_load(Path(path).read_text())
        except FileNotFoundError:
            raise SeedLedgerError(f"{path}: no such config file") from None
        except yaml.YAMLError as exc:
            mark = getattr(exc, "problem_mark", None)
            where = f" (line {mark.line + 1})" if mark else ""
            raise SeedLedgerError(f"{path}: not valid YAML{where}") from None
        if loaded is not None and not isinstance(loaded, dict):
            raise SeedLedgerError(f"{path}: expected a mapping of config keys")
        # the file's own relative paths are relative to the file
        data = absolute_refs(loaded or {}, Path(path).resolve().parent)
    # paths given with --set are relative to the working directory (validate's default)
    return validate(apply_overrides(data, list(overrides)), source, overrides=list(overrides))
