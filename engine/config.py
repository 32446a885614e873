"""Training configuration: YAML validated by pydantic, `--set key=value` overrides.

Unknown keys and bad values are bad input: `load_config` raises SeedLedgerError naming
the field and the reason. The resolved config (defaults filled in) is stored in the run,
so a resume or fork never depends on this file's defaults changing later.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Annotated, Any, Literal, get_args

import yaml
from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from seedledger.ledger.errors import SeedLedgerError, did_you_mean
from seedledger.ledger.seedfile import MAX_GENERATIONS, MAX_MEMBERS, MAX_POPULATION
from seedledger.replay.adapter import LoraSpec
from seedledger.replay.perturbation import DEFAULT_TARGETS, Perturbation
from seedledger.replay.task_settings import check_task_settings
from seedledger.trainers.adaptation import AdaptationSpec
from seedledger.trainers.cmaes import CMAESSpec
from seedledger.trainers.ga import GASpec
from seedledger.trainers.lmmaes import LMMAESSpec
from seedledger.trainers.optim import OptimizerSpec
from seedledger.trainers.schedules import Schedule
from seedledger.trainers.tasks.registry import (
    absolute_paths,
    check_rewards,
    task_levels,
    uses_loglik,
)

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


class Workers(Strict):
    pool: Literal["local", "ray"] = "local"
    count: int = Field(1, ge=1, le=MAX_WORKERS)
    address: str | None = Field(None, description="Ray cluster address; default $RAY_ADDRESS or local")


class Schedules(Strict):
    lr: Schedule = Schedule()
    sigma: Schedule = Schedule()


class Sampling(Strict):
    temperature: float = Field(0.0, ge=0.0, le=100.0, description="0 = greedy")
    top_p: float = Field(1.0, gt=0.0, le=1.0)


class CurriculumConfig(Strict):
    """Move the task's difficulty level by the recent success rate (trainers.rewards.curriculum)."""

    window: int = Field(5, ge=1, le=MAX_GENERATIONS, description="generations averaged before a change")
    raise_above: float = Field(0.7, ge=0.0, le=1.0)
    lower_below: float = Field(0.2, ge=0.0, le=1.0)
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


class Evaluation(Strict):
    """Held-out evaluation (`evaluate`, the demo) decodes greedily whatever `sampling` says,
    so its figures are deterministic and comparable between runs."""

    rows: int = Field(64, ge=1, le=MAX_ROWS, description="held-out rows scored by `evaluate`")
    every: int | None = Field(
        None, ge=1, description="during training, score the held-out rows every K generations "
        "and at the session's end (`evaluation` events; never used by the update)",
    )


class KLConfig(Strict):
    """reward − β·KL(member ‖ base) from each completion's token log-probabilities under
    the member and the frozen base model (trainers.rewards.kl)."""

    beta: float = Field(0.05, ge=0.0, le=100.0, allow_inf_nan=False, description="β, or its start when adapted")
    estimator: Literal["k1", "k3"] = "k3"
    target: float | None = Field(
        None, gt=0.0, allow_inf_nan=False,
        description="a KL per completion to steer β toward (adaptive controller); none: β fixed",
    )
    horizon: float = Field(10_000.0, gt=0.0, allow_inf_nan=False, description="completions over which β may move ~20%")


class LowRank(Strict):
    """EGGROLL-style perturbations E = A·Bᵀ/√rank of the targeted linear layers only
    (replay.perturbation); every other parameter stays frozen."""

    kind: Literal["lowrank"] = "lowrank"
    rank: Literal[1, 4, 16, 64] = Field(1, description="a power of 4, so 1/√rank is exact")
    targets: list[str] = Field(
        list(DEFAULT_TARGETS), min_length=1,
        description="suffixes of the linear layers perturbed and trained (`<suffix>.weight`)",
    )


class LoraTrain(Strict):
    """Train a LoRA adapter on the frozen base instead of every weight (replay.adapter).
    Unset fields are filled in when the run is created (engine.adapters.resolve) and
    stored with it: rank 8, alpha 16, every attention and MLP projection, A from the
    run's seed and B = 0, or all of them from the PEFT adapter directory `init`."""

    kind: Literal["lora"] = "lora"
    rank: int | None = Field(None, ge=1, le=4096)
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


def _shorthand(kinds: tuple[str, str]):
    """`perturbation: lowrank`, `train: lora` and `--set perturbation.rank=4` / `--set
    train.rank=8` (which arrive as {name: full, rank: ...}) mean the obvious thing."""
    plain, other = kinds

    def parse(value: Any) -> Any:
        if isinstance(value, str) and value not in kinds:
            raise ValueError(f"{value!r} is not one of {plain}, {other} or {{kind: {other}, ...}}")
        if value == other:
            return {"kind": other}
        if isinstance(value, dict) and "name" in value and "kind" not in value:
            value = {("kind" if k == "name" else k): v for k, v in value.items()}
            if value["kind"] == plain and set(value) - {"kind"}:
                value["kind"] = other  # settings given to the plain kind ask for the other
        if isinstance(value, dict) and value.get("kind") == plain and set(value) == {"kind"}:
            return plain
        return value

    return parse


class TrainConfig(Strict):
    model: str = "smollm2-135m-instruct"
    algorithm: Literal["es", "ga", "cmaes", "lmmaes"] = Field(
        "es", description="the policy (trainers.policy.ALGORITHMS)"
    )
    ga: GASpec | None = Field(None, description="the GA's settings (algorithm: ga; trainers.ga)")
    cmaes: CMAESSpec | None = Field(None, description="CMA-ES settings (algorithm: cmaes; trainers.cmaes)")
    lmmaes: LMMAESSpec | None = Field(None, description="LM-MA-ES settings (algorithm: lmmaes; trainers.lmmaes)")
    task: str | dict[str, Any] = "arithmetic"
    population: int = Field(8, ge=1, le=MAX_POPULATION, description="at most what a seed file holds")
    mirrored: bool = True
    sigma: float = Field(1e-3, gt=0.0, le=MAX_SCALE)
    lr: float = Field(5e-4, gt=0.0, le=MAX_SCALE)
    optimizer: OptimizerSpec = OptimizerSpec()
    schedule: Schedules = Schedules()
    adaptation: AdaptationSpec | None = Field(
        None, description="adapt σ (and lr) during the run from the rewards (trainers.adaptation)"
    )
    shaping: Literal["zscore", "centered_rank", "difference", "pareto"] = "zscore"
    generations: int = Field(10, ge=0, le=MAX_GENERATIONS)
    batch_size: int = Field(16, ge=1, le=MAX_BATCH)
    max_new_tokens: int = Field(32, ge=1, le=MAX_NEW_TOKENS)
    sampling: Sampling = Sampling()
    seed: int = Field(0, ge=0, lt=2**63)
    backend: Literal["auto", "hf", "vllm"] = Field(
        "auto", description="vllm where installed and able, else hf: chosen when the run is created (engine.backend_choice)"
    )
    device: str = "cpu"
    dtype: Literal["float32", "bfloat16", "float16"] = "float32"
    workers: Workers = Workers()
    anchor_every: int = Field(0, ge=0, le=MAX_GENERATIONS, description="save an anchor every K generations; 0 = never")
    report_to: list[Literal["tensorboard", "mlflow", "wandb"]] = []
    keep_samples: bool = Field(False, description="store every completion in the ledger (audit)")
    evaluation: Evaluation = Evaluation()
    curriculum: CurriculumConfig | None = None
    passk: PassKConfig | None = None
    perturbation: Annotated[Literal["full"] | LowRank, BeforeValidator(_shorthand(("full", "lowrank")))] = Field(
        "full", description="full-rank noise on every parameter, or low-rank on the targeted linears"
    )
    train: Annotated[Literal["full"] | LoraTrain, BeforeValidator(_shorthand(("full", "lora")))] = Field(
        "full", description="the trained parameters: every weight, or a LoRA adapter on a frozen base"
    )
    base_quantization: Literal["none", "int8"] = Field(
        "none", description="an adapter run's frozen base: as stored, or int8 weight-only (torchao)"
    )
    kl: KLConfig | None = None
    members_per_forward: int | None = Field(
        None, ge=1, le=MAX_POPULATION,
        description="members evaluated together in one batched forward (low-rank); omitted: "
        "chosen when the run is created (engine.batching) and stored with it",
    )

    @field_validator("task")
    @classmethod
    def _rewards_are_valid(cls, task: Any) -> Any:
        """Reward options are config too: a typo is found now, not at the first generation."""
        try:
            check_rewards(task)
            check_task_settings(task)  # sizes and sandbox limits: bounded before any data is built
        except SeedLedgerError as exc:
            raise ValueError(str(exc)) from None
        return task
    @model_validator(mode="after")
    def _kl_needs_hf(self) -> TrainConfig:
        if self.kl is not None and self.backend == "vllm":
            raise ValueError("kl: the KL-to-base penalty needs backend: hf (it scores tokens under a frozen base model)")
        return self

    def perturbation_spec(self) -> Perturbation:
        """The replay-side description of `perturbation`."""
        if self.train != "full":
            return Perturbation.lora(self.train.spec())
        if self.perturbation == "full":
            return Perturbation()
        return Perturbation.lowrank(self.perturbation.rank, self.perturbation.targets)

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
    def _algorithm_settings(self) -> TrainConfig:
        if self.algorithm != "es" and self.optimizer.name != "sgd":
            raise ValueError(f"algorithm {self.algorithm}: its update is applied as is, so optimizer must be sgd")
        if self.algorithm == "ga":
            if self.mirrored:
                raise ValueError("algorithm ga: genomes are single mutations; set mirrored: false")
            if (self.ga or GASpec()).parents > self.population:
                raise ValueError("ga.parents: more parents than the population holds")
            self._ga_survivors()
        if self.ga is not None and self.algorithm != "ga":
            raise ValueError("ga: settings given but algorithm is not ga")
        if self.cmaes is not None and self.algorithm != "cmaes":
            raise ValueError("cmaes: settings given but algorithm is not cmaes")
        if self.algorithm == "cmaes" and self.cmaes and self.cmaes.mu and self.cmaes.mu > self.population:
            raise ValueError("cmaes.mu: more parents than the population holds")
        if self.lmmaes is not None and self.algorithm != "lmmaes":
            raise ValueError("lmmaes: settings given but algorithm is not lmmaes")
        if self.algorithm == "lmmaes":
            self._lmmaes_settings()
        return self

    def _ga_survivors(self) -> None:
        """Survivors beyond the master ride as offsets the size of the trained weights that
        members are built from in the evaluating process: the in-process hf backend (full
        rank: K − 1 fp32 copies of the model beside the master; low-rank noise has no
        offsets)."""
        spec = self.ga or GASpec()
        survivors = spec.survivors
        if survivors == 1:
            return
        if spec.parents != GASpec.model_fields["parents"].default:  # a stored config spells the default out
            raise ValueError("ga.parents: with survivors > 1 the survivors are the parents; drop parents")
        if self.train == "full" and self.perturbation != "full":
            raise ValueError("ga.survivors: survivors are kept as full-size offsets; use perturbation: full "
                             "or train an adapter (train: lora)")
        if self.backend == "vllm" or self.workers.pool != "local":
            raise ValueError("ga.survivors: members carry offset terms only the in-process hf backend builds; "
                             "use backend: hf and workers.pool: local")
        if survivors >= self.population:
            raise ValueError(f"ga.survivors: {survivors} survivors leave no room for children in a population "
                             f"of {self.population}")

    def _lmmaes_settings(self) -> None:
        """LM-MA-ES keeps m paths the size of the trained weights and builds members from
        them in the evaluating process: adapter runs on the in-process hf backend."""
        spec = self.lmmaes or LMMAESSpec()
        if self.train == "full":
            raise ValueError("algorithm lmmaes: its paths are m copies of the trained weights; "
                             "train an adapter (train: lora)")
        if self.backend == "vllm" or self.workers.pool != "local":
            raise ValueError("algorithm lmmaes: members carry path terms only the in-process hf backend "
                             "builds; use backend: hf and workers.pool: local")
        if self.mirrored:
            raise ValueError("algorithm lmmaes: its samples are independent; set mirrored: false")
        if spec.mu and 2 * spec.mu >= self.population + 1:
            raise ValueError(f"lmmaes.mu: {spec.mu} parents leave the last one a weight ln((λ+1)/2) − ln μ "
                             f"that is not positive; use μ < (population + 1)/2 = {(self.population + 1) / 2:g}")
        if spec.adapt_sigma and self.adaptation is not None:
            raise ValueError("algorithm lmmaes: σ follows its path p_σ; drop `adaptation` "
                             "(or set lmmaes.adapt_sigma: false)")

    @model_validator(mode="after")
    def _adapters_and_quantization(self) -> TrainConfig:
        if self.train != "full" and self.perturbation != "full":
            raise ValueError("a LoRA adapter is perturbed with full-rank noise on its own tensors: "
                             "drop `perturbation` (low-rank ES applies to full-model runs)")
        if self.base_quantization != "none" and self.train == "full":
            raise ValueError(f"base_quantization {self.base_quantization}: only an adapter's frozen "
                             "base can be quantized (train: lora)")
        if self.base_quantization != "none" and self.backend == "vllm":
            raise ValueError(f"base_quantization {self.base_quantization}: the vllm backend serves the "
                             "frozen base as stored; use backend: hf")
        return self

    @model_validator(mode="after")
    def _mirrored_needs_pairs(self) -> TrainConfig:
        if self.mirrored and self.population % 2:
            raise ValueError(f"population must be even when mirrored (got {self.population})")
        return self

    @model_validator(mode="after")
    def _adaptation_needs_pairs(self) -> TrainConfig:
        if self.adaptation and self.adaptation.sigma and (not self.mirrored or self.population < 4):
            raise ValueError("adaptation.sigma: needs mirrored pairs, at least two (population >= 4)")
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
            raise ValueError("kl: the penalty scores decoded completions, and with only loglik rewards none are decoded")
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
    for item in overrides:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise SeedLedgerError(f"--set expects key=value, got {item!r}")
        node = data
        parts = key.split(".")
        for part in parts[:-1]:
            child = node.get(part)
            if not isinstance(child, dict):
                child = {} if child is None else {"name": child}
                node[part] = child
            node = child
        node[parts[-1]] = _parse_scalar(value)
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
    if isinstance(data, dict) and "task" in data:
        data = {**data, "task": absolute_paths(data["task"], base_dir or Path.cwd())}
    data = _absolute_init(data, base_dir or Path.cwd())
    try:
        return TrainConfig.model_validate(data)
    except ValidationError as exc:
        raise SeedLedgerError(_report(exc.errors(), source, overrides)) from None


def _report(errors: list[dict[str, Any]], source: str, overrides: Sequence[str]) -> str:
    """All of a validation's errors as one line, the most specific one per field."""
    by_field: dict[tuple, list[dict[str, Any]]] = {}
    for err in errors:
        by_field.setdefault(_path(err["loc"])[:1], []).append(err)
    lines = [_describe(_most_specific(errs), source, overrides) for errs in by_field.values()]
    return lines[0] if len(lines) == 1 else f"{len(lines)} config errors: " + "; ".join(lines)


def _describe(err: dict[str, Any], source: str, overrides: Sequence[str]) -> str:
    path = _path(err["loc"])
    where = ".".join(map(str, path))
    reason = err["msg"].removeprefix("Value error, ")
    if err["type"] == "extra_forbidden":
        reason = "unknown key" + did_you_mean(str(path[-1]), _keys_at(path[:-1]))
    blame = _blame(where, overrides) or source
    return f"{blame}: {where}: {reason}" if where else f"{blame}: {reason}"


def _path(loc: tuple) -> tuple:
    """A pydantic error location as config keys (union branch names dropped)."""
    return tuple(p for p in loc if not _is_union_tag(p))


def _blame(where: str, overrides: Sequence[str]) -> str | None:
    """`--set KEY=VALUE`, the last override that wrote `where` or a mapping above or below it."""
    for item in reversed(overrides):
        key = item.partition("=")[0].strip()
        if where and (key == where or where.startswith(key + ".") or key.startswith(where + ".")):
            return f"--set {item}"
    return None


def _keys_at(path: tuple) -> list[str]:
    """The config keys allowed at `path` (for "did you mean")."""
    model: Any = TrainConfig
    for part in path:
        fields = getattr(model, "model_fields", {})
        if part not in fields:
            return []
        model = _model_of(fields[part].annotation)
    return list(getattr(model, "model_fields", {}))


def _model_of(annotation: Any) -> Any:
    """The pydantic model inside an annotation (`X | None`, `Annotated[...]`), if any."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in get_args(annotation):
        found = _model_of(arg)
        if found is not None:
            return found
    return None


def _absolute_init(data: Any, base_dir: Path) -> Any:
    """`train.init` (a PEFT adapter directory) made absolute against `base_dir`, as
    dataset paths are, so the stored config finds it from anywhere."""
    train = data.get("train") if isinstance(data, dict) else None
    if isinstance(train, dict) and isinstance(train.get("init"), str) and train["init"]:
        init = Path(train["init"]).expanduser()
        data = {**data, "train": {**train, "init": str(init if init.is_absolute() else Path(base_dir) / init)}}
    return data


def _is_union_tag(part: Any) -> bool:
    """pydantic names a union's branches in error locations (`literal['full']`, `LowRank`);
    config keys are lower-case, so these are told apart by their first character."""
    return isinstance(part, str) and (part.startswith("literal[") or part[:1].isupper())


def _most_specific(errors: list[dict[str, Any]]) -> dict[str, Any]:
    """The error to report for one field: for a union, the branch that got furthest into
    the value (a mapping's bad key rather than "should be 'full'")."""
    return max(errors, key=lambda e: len(_path(e["loc"])))


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
        data = loaded or {}
        if "task" in data:  # the file's own relative paths are relative to the file
            data["task"] = absolute_paths(data["task"], Path(path).resolve().parent)
        data = _absolute_init(data, Path(path).resolve().parent)
    # paths given with --set are relative to the working directory (validate's default)
    return validate(apply_overrides(data, list(overrides)), source, overrides=list(overrides))
