"""Many members' modules as one batched forward: `torch.func.vmap` of `functional_call`.

The members of a generation share one architecture and differ only in their parameters,
so their parameters are stacked along a new first dimension and one vmapped forward runs
them all, each row of the input through its own member's weights (gym_task's vectorized
mode). The user's module sees what it sees one at a time (one observation, its own
parameters); only the kernels differ: a batched matmul rounds differently from a single
one, so outputs can differ from the one-at-a-time forward in the last bits. They do not
depend on which or how many other rows share the forward (tests/test_module_vec.py), so a
worker's share, a resume and the episodes still running give each member the same bits.

vmap costs a few hundred µs per call whatever the batch. An `nn.Sequential` of `nn.Linear`
and elementwise activations on 1-D inputs (the usual control policy) runs instead as the
ops vmap itself runs for it, a batched matmul then the bias per linear: the same bits
(tested), for a few µs.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from seedledger.ledger.errors import SeedLedgerError

# parameter-free modules that act element by element: the same op on a batch as on one row
_ELEMENTWISE = (torch.nn.Identity, torch.nn.Tanh, torch.nn.ReLU, torch.nn.ReLU6, torch.nn.Sigmoid, torch.nn.ELU,
                torch.nn.GELU, torch.nn.LeakyReLU, torch.nn.SiLU, torch.nn.Mish, torch.nn.Softplus,
                torch.nn.Softsign, torch.nn.Hardtanh, torch.nn.Tanhshrink)


def linear_stack(module: torch.nn.Module) -> list[tuple[str, torch.nn.Module]] | None:
    """(name, layer) of a plain `nn.Sequential` of `nn.Linear` and `_ELEMENTWISE` layers
    without hooks, else None (vmap runs it)."""
    layers = list(module.named_children())
    plain = type(module) is torch.nn.Sequential and not _hooked(module) and all(
        type(layer) in (torch.nn.Linear, *_ELEMENTWISE) and not _hooked(layer) for _, layer in layers)
    return layers if plain else None


def _hooked(module: torch.nn.Module) -> bool:
    return bool(module._forward_hooks or module._forward_pre_hooks)


class StackedPolicy:
    """`policy(x, owners)`: row i of `x` through the module of member `owners[i]`."""

    def __init__(self, modules: Sequence[torch.nn.Module], label: str):
        from torch.func import functional_call, stack_module_state

        self.label = label
        self.params, self.buffers = stack_module_state(list(modules))
        base = modules[0]

        def one(params: dict, buffers: dict, x: torch.Tensor) -> Any:
            return functional_call(base, (params, buffers), (x,))

        self._forward = torch.vmap(one)
        self._layers = linear_stack(base)
        self._owners: tuple[int, ...] = ()
        self._picked: tuple[dict, dict] = ({}, {})

    @torch.no_grad()
    def __call__(self, x: torch.Tensor, owners: Sequence[int]) -> torch.Tensor:
        owners = tuple(owners)
        if owners != self._owners:  # the rows still playing changed: gather their parameters once
            index = torch.tensor(owners, device=next(iter(self.params.values())).device)
            self._picked = ({n: t.index_select(0, index) for n, t in self.params.items()},
                            {n: t.index_select(0, index) for n, t in self.buffers.items()})
            self._owners = owners
        if self._layers is not None and x.dim() == 2:
            return self._linear_stack(x)
        try:
            return self._forward(*self._picked, x)
        except Exception as exc:  # data-dependent control flow, .item(), in-place on inputs ...
            raise SeedLedgerError(f"{self.label}: vectorized=true needs a module that runs under torch.vmap; "
                                  f"drop it ({type(exc).__name__}: {exc})".splitlines()[0]) from None

    def _linear_stack(self, x: torch.Tensor) -> torch.Tensor:
        """`linear_stack`'s layers on rows `x`, as vmap runs them (bmm, then + bias)."""
        params = self._picked[0]
        for name, layer in self._layers:
            if type(layer) is torch.nn.Linear:
                x = torch.bmm(x.unsqueeze(1), params[f"{name}.weight"].transpose(1, 2)).squeeze(1)
                if layer.bias is not None:
                    x = x + params[f"{name}.bias"]
            else:
                x = layer(x)
        return x
