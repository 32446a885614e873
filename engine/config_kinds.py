"""The config sections that name a perturbation kind, and the one contract they keep.

One key names a run's kind: `train:` takes "full" or a `SECTIONS` entry (engine.config);
each is a `KindSection`, whose protocol is the whole of what the engine reads of a kind's
config: checked when the section's class is created (import), so a section that lacks part
of it is refused before any config or run exists. `perturbation:`, the older key for the
kinds on the model's own weights, still reads (`one_key`): runs stored with it are never
rewritten, since their digests cover their stored configs.
"""

from __future__ import annotations

from typing import Any, ClassVar, Literal, Union

from pydantic import Field, ValidationError, model_validator
from pydantic_core import PydanticCustomError

from seedledger.engine.config_backends import BACKEND_FORMS
from seedledger.engine.config_sections import Strict
from seedledger.ledger.errors import did_you_mean
from seedledger.replay.adapter import LoraSpec
from seedledger.replay.kinds import (
    DEFAULT_TARGETS,
    Adapter,
    Full,
    Int8Kind,
    PerturbationKind,
    QuantCodes,
    QuantScales,
)
from seedledger.replay.kinds import LowRank as LowRankKind
from seedledger.replay.kinds.forms import refusal


class KindSection(Strict):
    """The typed protocol of a kind's config section. A concrete section (one with a
    `kind: Literal["word"]` field, the word `train:` takes) declares:

    - `kind_type`: the replay kind class it names (its `label` and member `forms` are read
      while a LoRA section is still unresolved: messages, backend compatibility);
    - `perturbation_kind()`: the replay kind itself;

    and may override `dtype_policy(dtype, base_quantization)` (the run's stored policy:
    fp32 master by default), `refusal(base_quantization, backend)` (a one-line reason the
    run cannot go as configured; backends are matched by member form, not here) and
    `on_weights` (True where its master is the model's own fp32 weights, as `full`'s)."""

    kind_type: ClassVar[type[PerturbationKind]]
    # The master is the model's own fp32 weights (as `full`'s), not a state of the kind's own
    # (an adapter, int8 codes or scales): a fork may switch among such kinds, and a
    # torch.nn.Module run takes them.
    on_weights: ClassVar[bool] = False

    @classmethod
    def __pydantic_init_subclass__(cls, **kwargs: Any) -> None:
        super().__pydantic_init_subclass__(**kwargs)
        if "kind" not in cls.model_fields:
            return  # a base shared by sections (Int8Train), not one itself
        word = cls.model_fields["kind"].default
        if not isinstance(word, str):
            raise TypeError(f"config section {cls.__name__} lacks a default for `kind` (the word that selects it)")
        kind_type = getattr(cls, "kind_type", None)
        if not (isinstance(kind_type, type) and issubclass(kind_type, PerturbationKind)):
            raise TypeError(f"config section {cls.__name__} ({word}) lacks kind_type: the replay kind class it names")
        if cls.perturbation_kind is KindSection.perturbation_kind:
            raise TypeError(f"config section {cls.__name__} ({word}) lacks perturbation_kind(): the kind it builds")

    def perturbation_kind(self) -> PerturbationKind:
        """The replay-side kind this section names."""
        raise NotImplementedError

    def dtype_policy(self, dtype: str, base_quantization: str) -> str:
        """The run's `dtype_policy`: an fp32 master, members evaluated in `dtype`."""
        return f"fp32-master/{dtype}-eval"

    def refusal(self, base_quantization: str, backend: str) -> str | None:
        """Why this run cannot go as configured (one line), else None."""
        return quantized_base_refusal(base_quantization)


def quantized_base_refusal(base_quantization: str) -> str | None:
    """Why `base_quantization` does not apply to a run with no frozen base, else None."""
    if base_quantization == "none":
        return None
    return f"base_quantization {base_quantization}: only an adapter's frozen base can be quantized (train: lora)"


def word(section: type[KindSection]) -> str:
    """The word that selects `section` (its `kind` field's default)."""
    return section.model_fields["kind"].default


class LowRank(KindSection):
    """EGGROLL-style perturbations E = A·Bᵀ/√rank of the targeted linear layers only
    (replay.perturbation); every other parameter stays frozen."""

    kind_type: ClassVar[type[PerturbationKind]] = LowRankKind
    on_weights: ClassVar[bool] = True

    kind: Literal["lowrank"] = Field("lowrank", description="selects low-rank noise")
    rank: Literal[1, 4, 16, 64] = Field(1, description="a power of 4, so 1/√rank is exact")
    targets: list[str] = Field(
        list(DEFAULT_TARGETS), min_length=1,
        description="suffixes of the linear layers perturbed and trained (`<suffix>.weight`)",
    )

    def perturbation_kind(self) -> PerturbationKind:
        """The replay-side kind this section names (replay.kinds.lowrank)."""
        return LowRankKind.of(self.rank, self.targets)


class LoraTrain(KindSection):
    """Train a LoRA adapter on the frozen base instead of every weight (replay.adapter).
    Unset fields are filled in when the run is created (engine.runtime.models.adapters.resolve) and
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


class Int8Train(KindSection):
    """What the int8 sections share (replay.kinds.quant_scales.Int8Kind; docs/quantized.md):
    the run starts from the fp32 base and its first generation quantizes the targeted
    linears (symmetric, per output row); the kind says what moves from then on. Which
    backends serve it follows from its kind's member forms (engine.config_backends)."""

    kind_type: ClassVar[type[Int8Kind]]

    targets: list[str]

    def perturbation_kind(self) -> PerturbationKind:
        """The replay-side kind this section names (replay.kinds)."""
        return self.kind_type.of(self.targets)

    def refusal(self, base_quantization: str, backend: str) -> str | None:
        """Why this run cannot go as configured (one line), else None."""
        if base_quantization != "none":
            return (f"base_quantization {base_quantization}: a {self.kind_type.name} run quantizes the base "
                    "itself (int8 codes, fp32 scales); drop base_quantization")
        return None


class QuantScalesTrain(Int8Train):
    """ES over the per-row scales of an int8 weight-only model, its integer codes frozen
    (replay.kinds.quant_scales; docs/quantized.md). The run starts from the fp32 base; its
    first generation quantizes the targeted linears (symmetric, per output row) and from
    then on only their scales move. σ is on the scales' own scale (about absmax/127)."""

    kind_type: ClassVar[type[Int8Kind]] = QuantScales

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


def shorthand(sections: tuple[type[KindSection], ...]):
    """The key's parser: `train: lora` (or `train: lowrank`, `train: quant_scales`) and
    `--set train.rank=8` (which arrives as {name: full, rank: 8}) mean the obvious thing:
    settings given to the plain kind, or a mapping that names no kind, ask for the first
    section. Each section is validated by itself (`_checked`), so its errors are not mixed
    with another's; the words come from the sections (`word`)."""
    kinds = ("full", *map(word, sections))
    plain, other = kinds[:2]
    own = {word(s): s for s in sections}

    def parse(value: Any) -> Any:
        if isinstance(value, str) and value not in kinds:
            raise ValueError(f"{value!r} is not one of {', '.join(kinds)} or {{kind: {other}, ...}}")
        if isinstance(value, str) and value != plain:
            return {"kind": value}
        if isinstance(value, dict) and not {"kind", "name"} & set(value):
            value = {"kind": other, **value}  # settings alone: those of the first section
        if isinstance(value, dict) and "name" in value and "kind" not in value:
            value = {("kind" if k == "name" else k): v for k, v in value.items()}
            if value["kind"] == plain and set(value) - {"kind"}:
                value["kind"] = other  # settings given to the plain kind ask for the other
        if isinstance(value, dict) and isinstance(value.get("kind"), str) and value["kind"] in own:
            return _checked(own[value["kind"]], value)
        if isinstance(value, dict) and value.get("kind") == plain and set(value) == {"kind"}:
            return plain
        return value

    return parse


def _checked(section: type[KindSection], value: dict) -> KindSection:
    """`value` validated as `section` alone, so that its errors are not mixed with another
    section's (a union reports every branch): its first error, at its key inside the section
    (`key_path`, which engine.config_errors appends to the section's)."""
    try:
        return section.model_validate(value)
    except ValidationError as exc:
        err = exc.errors()[0]
        unknown = "unknown key" + did_you_mean(err["loc"][-1] if err["loc"] else None, section.model_fields)
        why = unknown if err["type"] == "extra_forbidden" else err["msg"].removeprefix("Value error, ")
        raise PydanticCustomError("kind_section", "{reason}", {"reason": why, "key_path": err["loc"]}) from None


# The sections `train:` accepts besides "full" (the first is what settings given to the
# plain word ask for): a new kind adds its section here, and its word becomes a shorthand
# (`shorthand`; with `on_weights`, of the older `perturbation:` too).
SECTIONS: tuple[type[KindSection], ...] = (LoraTrain, LowRank, QuantScalesTrain, QuantCodesTrain)
Section = Union[SECTIONS]  # noqa: UP007 (a union built from the tuple)


def kind_refusal(train: Any, backend: str, base_quantization: str) -> str | None:
    """Why the kind `train` names cannot run as configured (one line), else None: it shares
    no member form with `backend` (replay.kinds.forms), or its section refuses."""
    kind = Full if train == "full" else train.kind_type
    why = refusal(kind.label, backend, kind.forms, BACKEND_FORMS[backend])
    if why is None and train == "full":
        return quantized_base_refusal(base_quantization)
    return why if why is not None else train.refusal(base_quantization, backend)


KEY, ALIAS = "train", "perturbation"  # the key that names the kind, and its older name
# what the older key names: "full" and the kinds on the model's own weights (its first
# section is what settings given to `perturbation: full` asked for: `--set perturbation.rank=4`)
ALIAS_WORDS = ("full", *(word(s) for s in SECTIONS if s.on_weights))


def kind_word(value: Any) -> Any:
    """The word a raw `train:` value selects, as `shorthand` reads it."""
    if isinstance(value, KindSection):
        return word(type(value))
    if not isinstance(value, dict):
        return value
    kind = value.get("kind", value.get("name"))
    return word(SECTIONS[0]) if kind is None or (kind == "full" and set(value) - {"kind", "name"}) else kind


def _alias_value(value: Any) -> Any:
    """An older `perturbation:` value as `train:` takes it (settings given to `full` ask for
    low-rank, as they did), or None where it names a kind the older key never named."""
    if isinstance(value, dict):
        value = {("kind" if k == "name" and "kind" not in value else k): v for k, v in value.items()}
        if value.get("kind", "full") == "full":
            if set(value) <= {"kind"}:
                return "full"
            value = {**value, "kind": ALIAS_WORDS[1]}
    return value if kind_word(value) in ALIAS_WORDS else None


def one_key(data: Any) -> Any:
    """A raw config mapping (a file, `--set`s, the config stored with a run) with the older
    `perturbation:` moved into `train:`. Runs stored before the move hold both keys, one of
    them `full`, and read so. Where both name a kind, or `perturbation:` one it never named,
    `data` comes back as it is, for validation to refuse (`alias_refusal`)."""
    if not isinstance(data, dict) or ALIAS not in data:
        return data
    alias, train = _alias_value(data[ALIAS]), data.get(KEY, "full")
    if alias is not None and kind_word(train) == "full":  # `full` is left out: a `--set train.kind=` starts afresh
        rest = {k: v for k, v in data.items() if k not in (ALIAS, KEY)}
        return rest if alias == "full" else {**rest, KEY: alias}
    if alias == "full" and kind_word(train) not in ALIAS_WORDS:
        return {k: v for k, v in data.items() if k != ALIAS}  # `perturbation: full` beside an adapter or int8 section
    return data


def alias_refusal(data: dict[str, Any]) -> str:
    """Why `data`'s `perturbation:` cannot be read as `train:` (`one_key` left it)."""
    value = data[ALIAS]
    if _alias_value(value) is None:
        return (f"perturbation: {_shown(value, repr)} is not one of {', '.join(ALIAS_WORDS)}: it is the older "
                "name of `train`, which names every kind")
    return (f"train: {_shown(kind_word(data.get(KEY)))} and perturbation: {kind_word(_alias_value(value))} both "
            "name the run's kind: `perturbation` is the older name of `train`; keep one")


def _shown(value: Any, how=str) -> str:
    """`value` in a message, cut to 60 characters (a stored config is untrusted input)."""
    text = how(value)
    return text if len(text) <= 60 else text[:57] + "..."


def older_form(data: dict[str, Any]) -> dict[str, Any]:
    """`data` with a `train:` on the model's own weights moved back to `perturbation:`, so
    that a `--set perturbation...` applies as it always did (`one_key` moves it again)."""
    if ALIAS in data or kind_word(data.get(KEY, "full")) not in ALIAS_WORDS:
        return data
    return {**{k: v for k, v in data.items() if k != KEY}, ALIAS: data.get(KEY, "full")}
