"""What the population benchmarks share: the prompts, the ES members, the LoRA-ES kind and a
trained adapter. population_bench, population_bench_vllm and lora_bench each import this
module and none imports another's helpers, so the three form no import circle
(tests/test_layout.py). Imports are lazy: importing this module loads no torch or model."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from seedledger.replay.perturbation import Perturbation

QUESTIONS = [
    "What is 3+4?", "Name three primary colors.", "Write a haiku about autumn.",
    "What is the capital of France?", "Explain photosynthesis in one sentence.",
    "What is 12 times 11?", "Give me a synonym for happy.", "How many legs does a spider have?",
    "Translate 'good morning' into Spanish.", "What is the boiling point of water in Celsius?",
    "Who wrote Romeo and Juliet?", "List two prime numbers greater than 10.",
    "What does CPU stand for?", "Describe the sea in five words.",
    "What is the square root of 81?", "Suggest a name for a cat.",
]


def members(n: int) -> tuple[list[int], list[int]]:
    """Keys and signs of `n` mirrored members of generation 1 of run 0 (pairs share a key)."""
    from seedledger.replay import noise

    keys = [noise.member_key(noise.run_key(0), 1, i // 2) for i in range(n)]
    return keys, [1 if i % 2 == 0 else -1 for i in range(n)]


def lora_perturbation(rank: int) -> Perturbation:
    """The benchmarks' LoRA-ES members: rank r, alpha 2r, on low-rank ES's target linears."""
    from seedledger.replay.adapter import LoraSpec
    from seedledger.replay.perturbation import Perturbation

    return Perturbation.lora(LoraSpec(rank, 2.0 * rank, Perturbation.lowrank(1).targets, "seed:0"))


def trained_adapter(master: dict) -> dict:
    """A trained adapter (B ≠ 0) from the initial one: speed must not hinge on B = 0."""
    from seedledger.replay import noise

    return {n: t + 0.01 * noise.generate(noise.tensor_key(1, n), t.numel()).view(t.shape)
            for n, t in master.items()}
