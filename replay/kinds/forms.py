"""Member forms: the shape a kind's members take when a backend evaluates them.

A kind declares the forms its members can take (``PerturbationKind.forms``), a backend the
forms it consumes, in its order of preference; the pair is allowed iff the two meet
(``common``), checked when the config is validated, before a run exists. The backend then
builds members in the first form it prefers that the kind has, with the kind's method for
that form, and never asks which kind it holds.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from enum import StrEnum
from typing import Any


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
