"""What each evaluation backend can do and build: one row per name the `backend` key takes.

Light on purpose (no torch, no backend import): the config checks a run against these rows
when it is validated, before a run exists, and each backend reads its own row to choose how
it builds members. A new backend adds its row to each table. `auto` is resolved when the
run is created (engine.runtime.backends.choice); it is held to hf's rows, its fallback.
"""

from __future__ import annotations

from seedledger.replay.kinds.forms import MemberForm
from seedledger.trainers.requirements import BASE_LOGPROBS, MEMBER_TERMS

# What algorithms may require of the backend (trainers.requirements' capabilities).
BACKEND_CAPABILITIES: dict[str, frozenset[str]] = {
    "auto": frozenset({MEMBER_TERMS, BASE_LOGPROBS}),
    "hf": frozenset({MEMBER_TERMS, BASE_LOGPROBS}),
    "vllm": frozenset(),
    "module": frozenset({MEMBER_TERMS}),  # any torch.nn.Module (engine.runtime.backends.module)
}

# The member forms it builds (replay.kinds.forms), in its order of preference: a kind runs
# on it iff they share one (`forms.refusal`); it builds the first it prefers that the kind offers.
HF_FORMS = (MemberForm.ROW_SCALES, MemberForm.ROW_TERMS, MemberForm.DEQUANTIZED, MemberForm.WEIGHTS)
BACKEND_FORMS: dict[str, tuple[MemberForm, ...]] = {
    "auto": HF_FORMS,
    "hf": HF_FORMS,
    "vllm": (MemberForm.LORA_SLOTS, MemberForm.WEIGHTS),
    "module": (MemberForm.WEIGHTS,),
}


# The KV caches its decoding takes (`sampling.kv_cache`): a static cache is transformers'
# (vLLM pages its own cache and captures its own graphs; a module is not decoded).
BACKEND_KV_CACHES: dict[str, tuple[str, ...]] = {
    "auto": ("dynamic", "static"),
    "hf": ("dynamic", "static"),
    "vllm": ("dynamic",),
    "module": ("dynamic",),
}


def decoding_refusal(backend: str, kv_cache: str) -> str | None:
    """Why the run's decoding settings cannot go on `backend` (one line), else None."""
    if kv_cache not in BACKEND_KV_CACHES[backend]:
        return f"sampling.kv_cache {kv_cache}: transformers' static cache needs backend: hf, not {backend}"
    return None
