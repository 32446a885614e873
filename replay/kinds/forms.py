"""Member forms: the shape a kind's members take when a backend evaluates them.

A kind declares the forms its members can take (``PerturbationKind.forms``), a backend the
forms it consumes, in its order of preference (``engine.config_backends.BACKEND_FORMS``);
the pair is allowed iff the two meet (``common``), checked when the config is validated,
before a run exists. The backend then builds members in the first form it prefers that the
kind has, with the kind's methods for that form, and never asks which kind it holds.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from enum import StrEnum
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    import torch

Shape = tuple[int, ...]


class MemberForm(StrEnum):
    """One way to build a member; each names the kind method that builds it."""

    WEIGHTS = "own weights"  # every weight rebuilt from the master: member_tensor_ (on member_weights)
    DEQUANTIZED = "dequantized weights"  # own weights of a master kept in another form (int8 codes)
    ROW_TERMS = "per-row terms"  # rank-r terms on the loaded master, one batched forward: row_terms
    ROW_SCALES = "row scales"  # per-row output scales on a loaded int8 master: row_scales
    LORA_SLOTS = "LoRA slots"  # one served LoRA adapter per member: lora_members

    @property
    def rides_master(self) -> bool:
        """Members ride on the master loaded in the model (the backend's `keeps_master`):
        whoever changes the master must load it again."""
        return self not in OWN_WEIGHTS


OWN_WEIGHTS = frozenset({MemberForm.WEIGHTS, MemberForm.DEQUANTIZED})  # built by member_tensor_


class MasterForm(StrEnum):
    """Where a kind's master lives in the evaluated model (``PerturbationKind.master_form``):
    each backend keeps one master store per form, built once from the kind, and loads,
    fingerprints and serves the master through it, never asking which kind it holds."""

    MODEL = "every weight of the model"  # the model is the master (in the kind's member_weights form)
    ADAPTER = "an adapter on a frozen base"  # the model is a frozen base, fingerprinted; the master a LoRA adapter


class RowMembers(Protocol):
    """What a kind whose members ride on the loaded master as rows gives (any riding form)."""

    def row_linear(self, module: str, shape: Shape) -> bool:
        """Does linear ``module`` (weight ``shape``) carry a per-member term (or slot)?"""

    @property
    def targets_label(self) -> str:
        """How messages name the linears ``row_linear`` picks."""


class RowTermMembers(RowMembers, Protocol):
    """``ROW_TERMS``: each member a rank-r term on the targeted linears (HF's batched forward)."""

    def row_terms(self, linears: Mapping[str, Shape], master: Mapping[str, torch.Tensor],
                  keys: Sequence[int | None], scales: Sequence[float], *, device: torch.device,
                  dtype: torch.dtype, paths: Sequence[Sequence[float]] = (), state: Any = None,
                  ) -> dict[str, tuple[torch.Tensor, torch.Tensor, float | None]]:
        """Each member's term on every linear (member-major stacks): y = x·Wᵀ + ((x·down)·up)·post,
        as (down [M, in, r], up [M, r, out], post). ``scales`` are ``member_scale``'s."""


class RowScaleMembers(RowMembers, Protocol):
    """``ROW_SCALES``: each member its own output scales on the shared int8 matmul's rows."""

    def row_scales(self, linears: Sequence[str], master: Mapping[str, torch.Tensor], keys: Sequence[int | None],
                   scales: Sequence[float], *, device: torch.device) -> dict[str, torch.Tensor]:
        """Each member's per-row output scales on every linear, [members, out]."""


class LoraSlotMembers(RowMembers, Protocol):
    """``LORA_SLOTS``: each member one LoRA adapter, served in a slot (vLLM)."""

    @property
    def lora_rank(self) -> int:
        """The rank of the LoRA slots members are served in."""

    @property
    def lora_targets(self) -> tuple[str, ...]:
        """The linear-module suffixes those slots cover (vLLM's ``lora_target_modules``)."""

    def lora_members(self, master: Mapping[str, torch.Tensor] | None, linears: Mapping[str, Shape],
                     keys: Sequence[int | None], scales: Sequence[float],
                     ) -> Iterator[dict[str, tuple[torch.Tensor, torch.Tensor]]]:
        """Each member's adapter by HF module name, (lora_A [r, in], lora_B [out, r]) with
        every scale folded in, made one at a time (vLLM's worker)."""


def _methods(protocol: type) -> tuple[str, ...]:
    return tuple(n for c in protocol.__mro__ if c.__name__.endswith("Members") for n in vars(c)
                 if not n.startswith("_"))


# The methods each form asks of a kind that declares it (checked when the kind's class is
# made: PerturbationKind.__init_subclass__). Own weights need nothing more than the replay
# core (member_tensor_ builds them from member_weights and noise_).
NEEDS: dict[MemberForm, tuple[str, ...]] = {
    MemberForm.WEIGHTS: (),
    MemberForm.DEQUANTIZED: (),
    MemberForm.ROW_TERMS: _methods(RowTermMembers),
    MemberForm.ROW_SCALES: _methods(RowScaleMembers),
    MemberForm.LORA_SLOTS: _methods(LoraSlotMembers),
}

def common(offered: Iterable[MemberForm], consumed: Sequence[MemberForm]) -> MemberForm | None:
    """The form a backend consuming ``consumed`` (its preference order) builds members of a
    kind offering ``offered`` in, or None when they share none."""
    offered = frozenset(offered)
    return next((form for form in consumed if form in offered), None)


def refusal(kind: str, backend: str, offered: Iterable[MemberForm], consumed: Sequence[MemberForm]) -> str | None:
    """One line when kind ``kind`` cannot run on backend ``backend``, else None."""
    if common(offered, consumed) is not None:
        return None
    return (f"kind {kind} cannot run on backend {backend}: its members take the form "
            f"{_names(offered)}, and backend {backend} builds {_names(consumed)}")


def chosen(kind: Any, backend: str, consumed: Sequence[MemberForm]) -> MemberForm:
    """The form ``backend`` builds ``kind``'s members in; ValueError (``refusal``'s line) if none."""
    form = common(kind.forms, consumed)
    if form is None:
        raise ValueError(refusal(kind.label, backend, kind.forms, consumed))
    return form


def _names(forms: Iterable[MemberForm]) -> str:
    return " or ".join(sorted(str(f) for f in forms)) or "none"
