"""Per-row rank-r terms on a transformers model's targeted linears: one batched forward for
a whole group of members, low-rank ES and LoRA adapters alike.

Both kinds add a rank-r term to a targeted linear's output, per member (the kind builds
it: `PerturbationKind.row_terms`; this module only carries it through the forward):

    y = x·Wᵀ + (x·D_m)·U_m · p         D_m: [in, r] "down", U_m: [r, out] "up"

- low-rank ES (E_m = A_m·B_mᵀ/√r from the member's key, `replay.perturbation`):
  D = B_m·(sign_m·σ/√r) (the member's scale folded in once per group, in fp32), U = A_mᵀ,
  no p (EGGROLL, arXiv 2511.16652). W is the master, loaded once per generation.
- LoRA (`replay.adapter`): member m's adapter is cast(master + sign_m·σ·ε) on every
  adapter tensor (v1 noise, what replay's update uses), D = A'ᵀ, U = B'ᵀ, p = alpha/r
  after the up-projection as PEFT applies `scaling`; W is the frozen base. With no member
  in flight the master adapter itself is *resident* (one group for every row: held-out
  evaluation and plain generation see the trained model).

Rows are member-major (member m owns `rows_per_member` consecutive rows), so a
[rows, seq, in] activation is viewed as [members, rows·seq, in] and the term is two
`bmm`s without gathering anything per row (for low-rank ES the second one, `baddbmm`, also
adds the term to the output: a decode step is dispatch-bound on a GPU, and each linear's hook
costs as many dispatches as it has ops; LoRA scales by p before adding, as PEFT does). A
group's factors or adapters are built once per `members` block (memory O(members·r·(in+out))
per targeted linear, never a member's full matrix). This is evaluation, not replay: the
matmuls are ordinary (BLAS) ones; what is exact is the update, in replay, and the member
adapters (`noise.perturb_`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, ClassVar

import torch
from torch import nn

from seedledger.replay.adapter import LoraSpec
from seedledger.replay.kinds import Adapter, PerturbationKind, member_scale


@dataclass
class Term:
    down: torch.Tensor  # [G, in, r]
    up: torch.Tensor  # [G, r, out]
    post: float | None = None  # one scale on the term (PEFT's `scaling`, applied as PEFT does)


class MemberRows:
    """Forward hooks on the linears `select(module_name, module)` picks, whose rows belong
    to members: what per-member terms (`RowTerms`) and per-member output scales
    (`hf_quant.ScaleRows`) share. A subclass gives `_hook(name)` and what `_active` and
    `_resident` hold per linear, and `set_resident`."""

    holds_master: ClassVar[bool] = False  # does `set_resident` write the whole master (MODEL form)?

    @classmethod
    def of(cls, model: nn.Module, kind: PerturbationKind):
        """The linears `kind` puts a per-member term on (`PerturbationKind.row_linear`)."""
        return cls(model, lambda name, module: kind.row_linear(name, tuple(module.weight.shape)), kind.targets_label)

    def __init__(self, model: nn.Module, select: Callable[[str, nn.Linear], bool], what: str):
        self.targets: dict[str, nn.Linear] = {
            name: module for name, module in model.named_modules()
            if isinstance(module, nn.Linear) and select(name, module)
        }
        if not self.targets:
            raise ValueError(f"no linear layer of the model matches the {what}")
        self._active: dict[str, Any] = {}  # the members in flight
        self._resident: dict[str, Any] = {}  # what every row gets when no member is
        self._rows: torch.Tensor | None = None  # member of each row, when rows are not member-major
        for name, module in self.targets.items():
            module.register_forward_hook(self._hook(name))

    def _hook(self, name: str) -> Callable[..., torch.Tensor | None]:  # pragma: no cover - subclasses
        raise NotImplementedError

    def set_resident(self, kind: PerturbationKind, master: dict[str, torch.Tensor]) -> None:  # pragma: no cover
        """Make `master` what every row gets while no member is in flight."""
        raise NotImplementedError

    @property
    def _like(self) -> torch.Tensor:
        return next(iter(self.targets.values())).weight

    @property
    def dtype(self) -> torch.dtype:
        """The activations' dtype (a quantized weight reports its activation dtype)."""
        return self._like.dtype

    @contextmanager
    def active(self, terms: dict[str, Any]) -> Iterator[None]:
        """Within the block, rows belong to these members' terms (member-major, equal shares)."""
        self._active = terms
        try:
            yield
        finally:
            self._active = {}

    @contextmanager
    def rows(self, member_of_row: Sequence[int]) -> Iterator[None]:
        """Within `active(...)`, forwards over any rows: row i belongs to member
        `member_of_row[i]` (a gather per call, for row slices such as token scoring)."""
        self._rows = torch.tensor(list(member_of_row), device=self._like.device)
        try:
            yield
        finally:
            self._rows = None


class RowTerms(MemberRows):
    """Per-member rank-r terms added to the targeted linears' outputs."""

    def _hook(self, name: str):
        def add_term(module: nn.Module, inputs: tuple[torch.Tensor, ...], out: torch.Tensor):
            term = self._active.get(name) if self._active else self._resident.get(name)
            if term is None:
                return None  # the loaded weights alone
            x = inputs[0]
            down, up = term.down, term.up
            if self._rows is not None and self._active:  # row i is member _rows[i]: a gather
                down, up = down[self._rows], up[self._rows]
            h = torch.bmm(x.reshape(down.shape[0], -1, x.shape[-1]), down)
            if term.post is None:
                return torch.baddbmm(out.reshape(down.shape[0], -1, out.shape[-1]), h, up).reshape(out.shape)
            return out + (torch.bmm(h, up) * term.post).reshape(out.shape)

        return add_term

    # ------------------------------------------------------------------ members

    def terms(self, kind: PerturbationKind, master: dict[str, torch.Tensor], keys: Sequence[int | None],
              scales: Sequence[float], *, paths: Sequence[Sequence[float]] = (), state: Any = None,
              ) -> dict[str, Term]:
        """Every member's term on the targeted linears, as the kind builds it
        (`PerturbationKind.row_terms`; `scales` are `member_scale`'s)."""
        linears = {name: tuple(module.weight.shape) for name, module in self.targets.items()}
        made = kind.row_terms(linears, master, keys, scales, device=self._like.device, dtype=self.dtype,
                              paths=paths, state=state)
        return {name: Term(*term) for name, term in made.items()}

    def set_resident(self, kind: PerturbationKind, master: dict[str, torch.Tensor]) -> None:
        """Make `master` (a frozen-base kind's adapter) resident: what the model is between members."""
        self._resident = self.terms(kind, master, [None], [member_scale(1, 0.0)])

    # the historic entry points, one per kind

    def lowrank(self, p: PerturbationKind, keys: Sequence[int], signs: Sequence[int], sigma: float) -> dict[str, Term]:
        """Every low-rank member's E = A·Bᵀ/√r term (mirrored pairs share their factors)."""
        return self.terms(p, {}, keys, [member_scale(s, sigma) for s in signs])

    def adapters(self, spec: LoraSpec, master: dict[str, torch.Tensor], keys: Sequence[int | None],
                 signs: Sequence[int], sigma: float, *, shrink: float = 1.0,
                 paths: Sequence[Sequence[float]] = (), state: Any = None) -> dict[str, Term]:
        """Member m's adapter cast(master + member_scale(sign_m, σ, shrink)·ε(key_m)) as its term."""
        return self.terms(Adapter(spec), master, keys, [member_scale(s, sigma, shrink) for s in signs],
                          paths=paths, state=state)
