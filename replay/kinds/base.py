"""The protocol every perturbation kind implements, and the member scale they all share.

A kind is what a run's two stored strings (``noise_spec``, ``param_selection``) name: which
tensors are trained and how replay applies a generation's coefficients to them (the replay
core), plus the member forms it offers the evaluation backends (``forms``: own weights,
built by ``member_tensor_`` here; per-row terms, row scales, LoRA slots, whose methods
``forms`` lists and a kind declaring them defines) and where its master lives
(``master_form``: the model's weights, or an adapter on a frozen base). Consumers call
these methods; none of them asks which kind it holds.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

import torch

from seedledger.ledger.errors import SeedLedgerError

from .. import paths as replay_paths
from ..noise import round_coefficient
from .forms import NEEDS, MasterForm, MemberForm

_WRITABLE = (torch.float32, torch.bfloat16, torch.float16)  # what noise.perturb_ writes in place
Item = tuple[str, torch.Tensor, list[torch.Tensor]]  # (name, θ, optimizer buffers) replay updates
Shape = tuple[int, ...]
RowTerm = tuple[torch.Tensor, torch.Tensor, float | None]  # down [M, in, r], up [M, r, out], post scale (forms)
LoraPair = tuple[torch.Tensor, torch.Tensor]  # lora_A [r, in], lora_B [out, r], every scale folded in (forms)


def short(x: object) -> str:
    """repr of untrusted text, cut to one short line."""
    text = repr(x)
    return text if len(text) <= 80 else text[:77] + "..."


def member_scale(sign: float, sigma: float, shrink: float = 1.0) -> float:
    """The coefficient of a member's noise: round(sign·round(σ·shrink)), exact with ε in fp32.

    The one rule every backend and ``replay.rebuild.apply_member`` use (shrink: LM-MA-ES's
    α, 1 otherwise); idempotent for an already-rounded σ."""
    return round_coefficient(float(sign) * round_coefficient(float(sigma) * shrink))


class PerturbationKind(ABC):
    """One perturbation kind. Subclasses are frozen dataclasses (equal when they print the
    same strings) registered in ``replay.kinds.KINDS``."""

    name: ClassVar[str]  # "full", "lowrank", "adapter"
    known_specs: ClassVar[tuple[str, ...]]  # the noise specs this kind may store
    master_form: ClassVar[MasterForm] = MasterForm.MODEL  # where the master lives: the model, or an adapter on it
    keeps_paths: ClassVar[bool] = True  # an optimizer `paths` rule (LM-MA-ES, GA survivors) applies
    label: ClassVar[str]  # how messages name it: "full", "lowrank", "lora"
    # the forms its members take (.forms): each asks for its methods (forms.NEEDS), checked below
    forms: ClassVar[frozenset[MemberForm]] = frozenset({MemberForm.WEIGHTS})
    usual_sigma: ClassVar[float] = 1e-3  # the σ it usually trains with (the paper's 1e-3)
    carried: ClassVar[tuple[str, ...]] = ()  # replay-state buffers kept across rule changes (quant_codes' residual)

    def __init_subclass__(cls, **kwargs: Any) -> None:
        """A kind lacking its names, or a method one of its member forms needs, is refused
        when its class is made (import), naming what it lacks, never when a backend first
        builds a member or a message first names it."""
        super().__init_subclass__(**kwargs)
        unnamed = [a for a in ("name", "label", "known_specs") if not hasattr(cls, a)]
        if unnamed:
            raise TypeError(f"kind {cls.__name__} lacks {unnamed[0]} (a class attribute every kind declares)")
        if "frozen_base" in vars(cls):
            raise TypeError(f"kind {cls.__name__} sets frozen_base: declare master_form (forms.MasterForm) instead")
        missing = [(form, m) for form in cls.forms for m in NEEDS[form] if not hasattr(cls, m)]
        if missing:
            form, method = missing[0]
            raise TypeError(f"kind {cls.__name__} declares member form {form.value!r} but lacks {method}")

    # --- the stored strings -------------------------------------------------------------

    @classmethod
    @abstractmethod
    def claims(cls, noise_spec: str, param_selection: str) -> bool:
        """Are these strings this kind's to parse (or to refuse with its own message)?"""

    @classmethod
    @abstractmethod
    def parse(cls, noise_spec: str, param_selection: str) -> PerturbationKind:
        """The kind these (claimed) strings name; one-line SeedLedgerError unless canonical."""

    @property
    @abstractmethod
    def noise_spec(self) -> str: ...

    @property
    @abstractmethod
    def param_selection(self) -> str: ...

    # --- replay ---------------------------------------------------------------------------

    @abstractmethod
    def trained(self, name: str, shape: Sequence[int]) -> bool:
        """Does this kind perturb and update tensor ``name``?"""

    def prepare(self, master: dict[str, torch.Tensor]) -> None:
        """Bring ``master`` into the form this kind trains, in place, before a step (a
        quantizing kind quantizes a plain master once), and refuse one it cannot train."""
        self.check_master(master)

    def check_master(self, master: Mapping[str, torch.Tensor]) -> None:
        """Refuse (one-line SeedLedgerError) a master this kind cannot train, changing
        nothing: here, any tensor that is not contiguous fp32 (e.g. a quantized master's
        int8 codes: a fork cannot leave the int8 kinds)."""
        for tname, theta in master.items():
            if theta.dtype == torch.int8:
                raise SeedLedgerError(f"master tensor {tname!r} holds int8 codes (a quantized master): "
                                      "only train: quant_scales or quant_codes trains it")
            if theta.dtype != torch.float32 or not theta.is_contiguous():
                raise SeedLedgerError(f"master tensor {tname!r} must be contiguous fp32")

    def master_names(self, shapes: Mapping[str, Shape]) -> list[str]:
        """The tensor names of a master with these (name -> shape) once ``prepare``d."""
        return list(shapes)

    def update(self, master: dict[str, torch.Tensor], state: Any, buffers: Sequence[str], keys: Sequence[int],
               coefs: Sequence[float], rule: int, scal: Sequence[float]) -> None:
        """One generation's step on ``master`` (``prepare``d), in place: ``apply`` on every
        trained tensor with its ``buffers`` from ``state`` (``replay.update.OptimizerState``).
        A kind whose step needs more of the master than its trained tensors overrides this."""
        trained = [(n, t) for n, t in master.items() if self.trained(n, t.shape)]
        items = [(n, t, [state.buffer(b, n, t) for b in buffers]) for n, t in trained]
        self.apply(items, keys, coefs, rule, scal)

    def member_weights(self, master: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """The weights a member's noise is added to, by the model's parameter names: the
        master itself, unless the kind evaluates another form of it (quant_codes: the
        dequantized weights)."""
        return master

    @property
    def member_kind(self) -> PerturbationKind:
        """The kind whose one-term SGD step on ``member_weights`` builds a member's genome
        (``replay.rebuild.apply_member``): this one, unless its step is no plain addition."""
        return self

    def member_tensor_(self, out: torch.Tensor, name: str, weights: Mapping[str, torch.Tensor], key: int,
                       scale: float, paths: Sequence[float] = (), state: Any = None) -> torch.Tensor:
        """``out`` := cast(member tensor ``name``), the weights-form member every backend builds
        and ``replay.rebuild.apply_member`` rebuilds: ``weights[name]`` (``member_weights``),
        plus scale·E(key) where ``member_kind`` trains it, plus the ``paths`` terms where this
        kind trains it, all in fp32, then one cast. ``scale`` is ``member_scale``'s."""
        src = weights[name].to(out.device)
        noisy = scale != 0.0 and self.member_kind.trained(name, src.shape)
        termed = any(b != 0.0 for b in paths) and self.trained(name, src.shape)
        if not (noisy or termed):
            return out.copy_(src)
        fp32 = out if not termed and out.dtype in _WRITABLE and out.is_contiguous() else torch.empty_like(src)
        if noisy:
            self.member_kind.noise_(fp32, src, name, key, scale)
        else:
            fp32.copy_(src)
        if termed:
            replay_paths.member_(fp32, name, state, paths)
        return fp32 if fp32 is out else out.copy_(fp32)

    def noise_(self, out: torch.Tensor, src: torch.Tensor, name: str, key: int, scale: float) -> torch.Tensor:
        """``out`` := cast(src + scale·E) for trained tensor ``name``, E this kind's noise of
        member ``key``: by definition the one-term SGD step of ``apply`` (a kind whose noise
        has a direct form, v1's ``perturb_``, overrides this with it, bit for bit)."""
        theta = src.clone()
        self.apply([(name, theta, [])], [key], [scale], 0, [])  # rule 0: SGD, θ + Σ c·E
        return out.copy_(theta)

    @abstractmethod
    def apply(self, items: Sequence[Item], keys: Sequence[int], coefs: Sequence[float], rule: int,
              scal: Sequence[float]) -> None:
        """One generation's update rule on the trained tensors ``items`` (``replay.update``):
        g = Σ c_i·(member i's noise) over the members with c_i ≠ 0, then the rule, in place."""

    # --- evaluation (the backends; each member form's own methods: .forms) ---------------

    @property
    def adapter(self) -> Any:
        """The LoRA spec a frozen-base kind trains (``replay.adapter.LoraSpec``), else None."""
        return None

    @property
    def kind(self) -> str:
        """The historic name: "lowrank", or "full" (an adapter is a full kind on its tensors)."""
        return "full"
