"""The module backend: any `torch.nn.Module` (engine.runtime.models.module) as the model.

It holds the module and builds each member's weights into it from the fp32 master, as the
hf backend does for a language model: tensor by tensor, the kind's own
`PerturbationKind.member_tensor_` (`cast(master + sign·σ·E)` on the tensors the kind trains,
never by subtraction, plus a member's path terms: LM-MA-ES, a GA's survivors), the member
`replay.rebuild.apply_member` rebuilds. The task (`trainers.tasks.fitness_task.ModelTask`)
then scores the member's module; a batched fitness (or a `gym:` task with `vectorized=true`,
which stacks their parameters into one batched forward) gets one copy of the module per
member of the group, made once and reused.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence

import torch

from seedledger.engine.config_backends import BACKEND_FORMS
from seedledger.engine.runtime.models.module import build_module, master_of
from seedledger.replay.kinds import Full, PerturbationKind, member_scale
from seedledger.replay.kinds.forms import chosen
from seedledger.replay.update import OptimizerState
from seedledger.trainers.member import Member


class ModuleBackend:
    keeps_master = False  # every member's weights are built from the master

    def __init__(self, ref: str, *, device: str = "cpu", perturbation: PerturbationKind | None = None):
        self.module = build_module(ref, device)
        self.perturbation = perturbation or Full()
        chosen(self.perturbation, "module", BACKEND_FORMS["module"])  # own weights, or a one-line refusal
        self._copies: list[torch.nn.Module] = []

    def master(self) -> dict[str, torch.Tensor]:
        return master_of(self.module)

    @torch.no_grad()
    def load_master(self, master: dict[str, torch.Tensor]) -> None:
        for name, param in self.module.named_parameters():
            param.data.copy_(master[name])

    def members(self, master: dict[str, torch.Tensor], members: Sequence[Member], sigma: float,
                state: OptimizerState | None, batched: bool) -> list[torch.nn.Module]:
        """Each member's module: the one module in turn (call it member by member), or with
        `batched` one copy per member, all built before the fitness sees any."""
        if not batched:
            self.load_member(self.module, master, members[0], sigma, state)
            return [self.module]
        while len(self._copies) < len(members):
            self._copies.append(copy.deepcopy(self.module))
        for module, member in zip(self._copies, members, strict=False):
            self.load_member(module, master, member, sigma, state)
        return self._copies[: len(members)]

    @torch.no_grad()
    def load_member(self, module: torch.nn.Module, master: dict[str, torch.Tensor], member: Member, sigma: float,
                    state: OptimizerState | None) -> None:
        """`module`'s parameters := the member's weights, cast to each parameter's dtype: the
        kind's `member_tensor_`, the member `replay.rebuild.apply_member` rebuilds."""
        scale = member_scale(member.sign, sigma, member.shrink)
        kind = self.perturbation
        weights = kind.member_weights(master)
        for name, param in module.named_parameters():
            kind.member_tensor_(param.data, name, weights, member.key, scale, member.paths, state)
