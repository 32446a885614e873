"""The module backend: any `torch.nn.Module` (engine.runtime.module_models) as the model.

It holds the module and builds each member's weights into it from the fp32 master, as the
hf backend does for a language model: `cast(master + sign·σ·ε)` tensor by tensor with
replay's noise (never by subtraction), plus a member's path terms (LM-MA-ES, a GA's
survivors) through `replay.paths.member_tensor`; a kind that perturbs only some tensors
(low-rank) builds the member with replay's own one-term update, the code
`replay.rebuild.apply_member` runs. The task (`trainers.tasks.fitness_task.ModelTask`)
then scores the member's module; a batched fitness (or a `gym:` task with `vectorized=true`,
which stacks their parameters into one batched forward) gets one copy of the module per
member of the group, made once and reused.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence

import torch

from seedledger.engine.runtime.module_models import build_module, master_of
from seedledger.ledger import ReplayStep
from seedledger.replay import noise
from seedledger.replay import paths as replay_paths
from seedledger.replay.kinds import Full, PerturbationKind, member_scale
from seedledger.replay.update import OptimizerState, apply_step
from seedledger.trainers.member import Member

_PERTURBED_DTYPES = (torch.float32, torch.bfloat16, torch.float16)  # what noise.perturb_ writes


class ModuleBackend:
    keeps_master = False  # every member's weights are built from the master

    def __init__(self, ref: str, *, device: str = "cpu", perturbation: PerturbationKind | None = None):
        self.module = build_module(ref, device)
        self.perturbation = perturbation or Full()
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
        """`module`'s parameters := the member's weights, cast to each parameter's dtype."""
        scale = member_scale(member.sign, sigma, member.shrink)
        params = dict(module.named_parameters())
        if any(b != 0.0 for b in member.paths):
            for name, param in params.items():
                param.data.copy_(replay_paths.member_tensor(master[name], name, member.key, scale, member.paths, state))
        elif scale == 0.0:
            for name, param in params.items():
                param.data.copy_(master[name])
        elif isinstance(self.perturbation, Full):
            for name, param in params.items():
                key = noise.tensor_key(member.key, name)
                if param.dtype in _PERTURBED_DTYPES and param.data.is_contiguous():
                    noise.perturb_(param.data, master[name], key, scale)
                else:
                    param.data.copy_(noise.perturb_(torch.empty_like(master[name]), master[name], key, scale))
        else:  # a kind that perturbs some tensors in its own way: replay's one-term update
            weights = {n: t.clone() for n, t in master.items()}
            step = ReplayStep(run="", index=0, keys=[member.key], coefficients=[scale], sigma=sigma,
                              optimizer={"name": "sgd", "lr": 1.0}, noise_spec=self.perturbation.noise_spec,
                              param_selection=self.perturbation.param_selection)
            apply_step(weights, OptimizerState(), step)
            for name, param in params.items():
                param.data.copy_(weights[name])
