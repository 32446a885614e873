"""The evaluation-backend surface: a generation's members in, their completions out.

The evaluator hands a backend one *group* of members at a time (their keys, signs and
sampling seeds, the shared σ) with the generation's prompts; the backend returns every
member's completions. How it batches is its business:

- members of the own-weights forms (`replay.kinds.forms`: full-rank runs, int8 codes):
  each member's weights `cast(master + sign·σ·ε)` are built from the fp32 master by the
  kind's `member_tensor_` (never undone by subtraction) and its prompts decoded
  (`evaluate_one_by_one`);
- members of a form that rides on the master (low-rank, adapters, int8 scales): the model
  keeps the master and every member's term, which the kind builds, rides on its own rows
  of one batched forward (HF: `row_terms` / `row_scales` on the linears `row_linear`
  picks; vLLM: one LoRA slot per member, `lora_members`).

Which form a backend builds is the first of its row in `engine.config_backends.BACKEND_FORMS`
that the kind offers; a pair that shares none is refused when the config is validated.

Every member's scale is `replay.kinds.member_scale(sign, σ, shrink)`, as replay's.

Groups are fixed by the run's stored `members_per_forward`, never by free memory or load
at run time, so a member's rows always share a forward with the same other rows and its
rewards do not depend on the machine, the pool or the worker count.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

import torch

Messages = list[dict[str, str]]


@dataclass(frozen=True)
class Population:
    """One group of members to evaluate on the same prompts (member order)."""

    keys: tuple[int, ...]
    signs: tuple[int, ...]
    sigma: float
    seeds: tuple[int | None, ...]  # per-member sampling seed; None decodes greedily
    # LM-MA-ES, a GA's survivors (`replay.paths`): the noise is scaled by round(σ·shrink),
    # and member m adds paths[m]ⱼ·Mⱼ along the replay state's paths; () otherwise
    shrink: float = 1.0
    paths: tuple[tuple[float, ...], ...] = ()
    state: Any = None

    def __post_init__(self) -> None:
        if not len(self.keys) == len(self.signs) == len(self.seeds):
            raise ValueError("a population needs one key, sign and seed per member")
        if self.paths and (len(self.paths) != len(self.keys) or self.state is None):
            raise ValueError("path terms need one row per member and the replay state")

    def __len__(self) -> int:
        return len(self.keys)


@dataclass
class PopulationOutput:
    """Completions per member (prompt-major, `samples` per prompt) and where time went."""

    completions: list[list[str]]
    seconds: dict[str, float] = field(default_factory=dict)  # load_member, generate
    # per member, per completion: (token log-probs under the member, under the frozen
    # base model), when the backend was asked for them (the KL-to-base penalty)
    logprobs: list[list[tuple[list[float], list[float]]]] | None = None


@dataclass
class LikelihoodOutput:
    """Per member, per row: the reference completion's mean token log-probability
    (`trainers.rewards.loglik`), and where time went."""

    scores: list[list[float]]
    seconds: dict[str, float] = field(default_factory=dict)  # score


@runtime_checkable
class Backend(Protocol):
    """Holds one model; member weights always derive from the fp32 master.

    `keeps_master` (its member form's `rides_master`): the backend evaluates members *on top
    of* the master loaded in the model (low-rank, adapters), so whoever changes the master
    must `load_master` it again; backends that rebuild every member's weights from the
    master say False.
    """

    keeps_master: bool

    def master(self) -> dict[str, torch.Tensor]: ...

    def load_master(self, master: dict[str, torch.Tensor]) -> None: ...

    def evaluate(
        self,
        master: dict[str, torch.Tensor],
        population: Population,
        prompts: list[Messages],
        max_new_tokens: int,
        samples: int = 1,
    ) -> PopulationOutput: ...

    def loglik(
        self,
        master: dict[str, torch.Tensor],
        population: Population,
        prompts: list[Messages],
        references: list[str],
    ) -> LikelihoodOutput: ...

    def generate(
        self,
        prompts: list[Messages],
        max_new_tokens: int,
        seed: int | None = None,
        *,
        temperature: float | None = None,
        top_p: float | None = None,
        samples: int = 1,
    ) -> list[str]:
        """Completions at the weights loaded now, in prompt order. Greedy unless
        `temperature` (else the backend's configured one) is > 0, which needs `seed`;
        sample s of prompt i is then seeded by `(seed, i, s)`, sample 0 exactly as with
        `samples=1`. `samples` > 1 returns that many completions per prompt, prompt-major."""
        ...


class FullRankMember(Protocol):
    def load_member(
        self, master: dict[str, torch.Tensor], key: int, sign: int, sigma: float
    ) -> None: ...

    def generate(self, prompts: list[Messages], max_new_tokens: int, seed: int | None = None,
                 *, samples: int = 1) -> list[str]: ...


def evaluate_one_by_one(
    backend: FullRankMember,
    master: dict[str, torch.Tensor],
    population: Population,
    prompts: list[Messages],
    max_new_tokens: int,
    samples: int = 1,
) -> PopulationOutput:
    """Full-rank evaluation: each member's own weights, then its prompts, in member order."""
    seconds = {"load_member": 0.0, "generate": 0.0}
    completions = []
    for key, sign, seed in zip(population.keys, population.signs, population.seeds, strict=True):
        started = time.perf_counter()
        backend.load_member(master, key, sign, population.sigma)
        loaded = time.perf_counter()
        completions.append(backend.generate(prompts, max_new_tokens, seed=seed, samples=samples))
        seconds["load_member"] += loaded - started
        seconds["generate"] += time.perf_counter() - loaded
    return PopulationOutput(completions, seconds)
