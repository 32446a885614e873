"""A whole group of low-rank members in one batched forward of a transformers model.

With member m's perturbation E_m = A_m·B_mᵀ/√r of a targeted weight W (A_m: out×r,
B_m: in×r, from the member's key: `replay.perturbation`), a row x of member m needs

    x·(W + s_m·E_m)ᵀ = x·Wᵀ + (s_m/√r)·(x·B_m)·A_mᵀ,      s_m = sign_m·σ,

so every member shares W (the master, loaded once per generation) and only the rank-r
term is per member: two small batched matmuls on top of the linear layer's own output
(EGGROLL, arXiv 2511.16652). Rows are member-major (member m owns `rows_per_member`
consecutive rows), so a [rows, seq, in] activation is viewed as [members, rows·seq, in]
and the term is `bmm(bmm(x, B) · scale, Aᵀ)` without gathering anything per row.

The factors of a generation are generated once (memory O(members·r·(in+out)) per
targeted matrix, never a member's full matrix). This is evaluation, not replay: the
matmuls here are ordinary (BLAS) ones; what is exact is the update, in replay.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager

import torch
from torch import nn

from replay.perturbation import Perturbation, stacked_factors


class RowLowRank:
    """Forward hooks on a model's targeted linears adding each row's member term."""

    def __init__(self, model: nn.Module, perturbation: Perturbation):
        if perturbation.kind != "lowrank":
            raise ValueError("RowLowRank needs a low-rank perturbation")
        self.perturbation = perturbation
        self.targets: dict[str, nn.Linear] = {
            f"{name}.weight": module
            for name, module in model.named_modules()
            if isinstance(module, nn.Linear)
            and perturbation.trained(f"{name}.weight", tuple(module.weight.shape))
        }
        if not self.targets:
            raise ValueError(
                f"no linear layer of the model matches the low-rank targets {perturbation.targets}"
            )
        self._factors: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}
        self._scale: torch.Tensor | None = None
        self._rows: torch.Tensor | None = None
        for name, module in self.targets.items():
            module.register_forward_hook(self._hook(name))

    def _hook(self, name: str):
        def add_member_terms(module: nn.Module, inputs: tuple[torch.Tensor, ...], out: torch.Tensor):
            if self._scale is None:
                return None  # the master alone (held-out evaluation)
            a, b = self._factors[name]  # [G, out, r], [G, in, r]
            x = inputs[0]
            if self._rows is not None:  # an explicit member per row (a slice of the rows)
                low = torch.bmm(x.reshape(x.shape[0], -1, x.shape[-1]), b[self._rows])
                low = low * self._scale[self._rows]
                return out + torch.bmm(low, a[self._rows].transpose(1, 2)).reshape(out.shape)
            members = a.shape[0]
            xg = x.reshape(members, -1, x.shape[-1])  # rows are member-major
            low = torch.bmm(xg, b) * self._scale  # [G, rows·seq, r]
            return out + torch.bmm(low, a.transpose(1, 2)).reshape(out.shape)

        return add_member_terms

    @contextmanager
    def members(self, keys: Sequence[int], signs: Sequence[int], sigma: float) -> Iterator[None]:
        """Within the block, rows belong to these members (member-major, equal shares)."""
        p = self.perturbation
        any_module = next(iter(self.targets.values()))
        device, dtype = any_module.weight.device, any_module.weight.dtype
        distinct = list(dict.fromkeys(keys))  # mirrored pairs share a key: make it once
        where = torch.tensor([distinct.index(k) for k in keys], device=device)
        for name, module in self.targets.items():
            a, b = stacked_factors(distinct, name, tuple(module.weight.shape), p.rank, device=device)
            self._factors[name] = (a.to(dtype)[where], b.to(dtype)[where])
        scale = [float(s) * sigma * p.inv_sqrt_rank for s in signs]
        self._scale = torch.tensor(scale, dtype=dtype, device=device).view(-1, 1, 1)
        try:
            yield
        finally:
            self._factors.clear()
            self._scale = None
            self._rows = None

    @contextmanager
    def rows(self, member_of_row: Sequence[int]) -> Iterator[None]:
        """Within `members(...)`, forwards over any rows: row i belongs to member
        `member_of_row[i]` (a gather per call, for row slices such as token scoring)."""
        device = next(iter(self.targets.values())).weight.device
        self._rows = torch.tensor(list(member_of_row), device=device)
        try:
            yield
        finally:
            self._rows = None
