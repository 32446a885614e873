"""The evaluation-backend surface that the generation loop talks to (hf now, vllm later)."""

from __future__ import annotations

from typing import Protocol, runtime_checkable

import torch

Messages = list[dict[str, str]]


@runtime_checkable
class Backend(Protocol):
    """Holds one model; member weights are always rebuilt from the fp32 master.

    `load_member` writes `cast(master + sign*sigma*eps(key))` into the model (never undoes
    a previous member by subtraction); `load_master` writes the master back bit for bit.
    """

    def master(self) -> dict[str, torch.Tensor]: ...

    def load_member(
        self, master: dict[str, torch.Tensor], key: int, sign: int, sigma: float
    ) -> None: ...

    def load_master(self, master: dict[str, torch.Tensor]) -> None: ...

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
        """Completions in prompt order. Greedy unless `temperature` (else the backend's
        configured one) is > 0, which needs `seed`; sample s of prompt i is then seeded by
        `(seed, i, s)`, sample 0 exactly as with `samples=1`. `samples` > 1 returns that
        many completions per prompt, prompt-major."""
        ...
