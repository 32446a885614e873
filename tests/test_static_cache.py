"""`sampling.kv_cache: static`: transformers' preallocated KV cache decodes what the dynamic
cache decodes greedily (plain, batched low-rank members, LoRA members), a run with it
reaches the same fingerprints, and a backend that cannot use it is refused at validation.

On CUDA the static cache is what lets transformers compile the decode step into CUDA graphs
(`hf_decode`'s docstring); that path is checked by the `gpu` test at the end."""

from __future__ import annotations

import pytest
import torch
import yaml

from seedledger.engine.config import validate
from seedledger.engine.runtime.backends import choice
from seedledger.engine.runtime.backends.hf import HFBackend
from seedledger.engine.runtime.backends.hf_decode import CACHE_BUCKET
from seedledger.ledger import Ledger
from seedledger.ledger.errors import SeedLedgerError
from seedledger.replay import noise
from seedledger.replay.adapter import LoraSpec
from seedledger.replay.kinds import Adapter
from seedledger.replay.perturbation import Perturbation
from tests.support.configs import TINY
from tests.support.runs import cli, fingerprints

SIGMA = noise.round_coefficient(0.05)  # large enough that members decode differently on `tiny`
PROMPTS = [[{"role": "user", "content": q}] for q in ("What is 2 + 3?", "Name a colour.", "Count to three.")]
KEYS, SIGNS = [11, 11, 12, 12], [1, -1, 1, -1]


@pytest.fixture
def static_caches(monkeypatch) -> list[int]:
    """The length of each static cache transformers allocates during the test (an option
    that were silently ignored would allocate none)."""
    import transformers.generation.utils as generation

    made: list[int] = []

    class Counted(generation.StaticCache):
        def __init__(self, *args, **kwargs):
            made.append(kwargs["max_cache_len"])
            super().__init__(*args, **kwargs)

    monkeypatch.setattr(generation, "StaticCache", Counted)
    return made


def _both(model_dir, **kwargs) -> tuple[HFBackend, HFBackend]:
    return (HFBackend(model_dir, batch_size=6, **kwargs),
            HFBackend(model_dir, batch_size=6, kv_cache="static", **kwargs))


def _member_rows(backend: HFBackend, master, keys=KEYS, *, new: int = 12) -> list[list[int]]:
    rows = [p for _ in keys for p in PROMPTS]
    with backend.members(master, keys, SIGNS, SIGMA):
        return backend._decode(rows, [None] * len(rows), new, batch=len(rows))


def _step_logits(backend: HFBackend, new: int = 8) -> torch.Tensor:
    """The logits of `new` greedy steps over PROMPTS, with the backend's KV cache."""
    cache = {"cache_implementation": "static"} if backend.kv_cache == "static" else {}
    with torch.inference_mode():
        out = backend.model.generate(**backend._encode(PROMPTS), max_new_tokens=new, do_sample=False,
                                     output_logits=True, return_dict_in_generate=True,
                                     pad_token_id=backend.tokenizer.pad_token_id, **cache)
    return torch.stack(out.logits)


def test_greedy_decoding_matches_the_dynamic_cache(tiny_model_dir, static_caches):
    """The logits agree up to summation order (the static cache attends over its whole,
    masked length: 1.3e-6 here), so greedy completions match but at near-ties; seeded
    sampling is reproducible, though a flat distribution's top-p order can differ from the
    dynamic cache's (the random `tiny` model's does)."""
    dynamic, static = _both(tiny_model_dir)
    theirs = dynamic.generate_ids(PROMPTS, 16)
    assert static_caches == []
    assert static.generate_ids(PROMPTS, 16) == theirs
    assert static_caches and all(n % CACHE_BUCKET == 0 for n in static_caches)  # one length per bucket
    assert (_step_logits(static) - _step_logits(dynamic)).abs().max().item() < 1e-4
    sampled = {"seed": 5, "temperature": 0.9, "top_p": 0.9, "samples": 2}
    assert static.generate_ids(PROMPTS, 16, **sampled) == static.generate_ids(PROMPTS, 16, **sampled)


@pytest.mark.parametrize("kind", [Perturbation.lowrank(4), Adapter(LoraSpec(2, 4, ("q_proj", "v_proj"), "seed:3"))],
                         ids=["lowrank", "lora"])
def test_batched_members_decode_as_with_the_dynamic_cache(tiny_model_dir, kind, static_caches):
    dynamic, static = _both(tiny_model_dir, perturbation=kind)
    master = dynamic.master()
    for backend in (dynamic, static):
        backend.load_master(master)
    ours = _member_rows(static, master)
    assert static_caches
    assert ours == _member_rows(dynamic, master)
    per_member = [tuple(map(tuple, ours[i : i + len(PROMPTS)])) for i in range(0, len(ours), len(PROMPTS))]
    assert len(set(per_member)) > 1  # the members' terms reached the decode: not all the base model


def test_a_run_with_the_static_cache_reaches_the_same_fingerprints(tmp_path, static_caches):
    ledger = tmp_path / "runs.db"
    for name in ("dynamic", "static"):
        cfg = tmp_path / f"{name}.yaml"
        cfg.write_text(yaml.safe_dump({**TINY, "train": {"kind": "lowrank", "rank": 4}, "sigma": 0.05,
                                       "sampling": {"kv_cache": name}}))
        cli("train", cfg, "--run", name, "--ledger", ledger)
        assert bool(static_caches) == (name == "static")  # the run's decoding used it (train runs in process)
    assert fingerprints(ledger, "static") == fingerprints(ledger, "dynamic")
    with Ledger.open(str(ledger)) as led:
        assert led.get_run("static").config["sampling"]["kv_cache"] == "static"  # stored: resume decodes alike


@pytest.mark.parametrize("backend", ["vllm", "module"])
def test_a_backend_without_transformers_cache_is_refused_at_validation(backend):
    model = "module:torch.nn:Identity" if backend == "module" else "tiny"
    task = "fitness:builtins:len" if backend == "module" else TINY["task"]
    with pytest.raises(SeedLedgerError, match=f"sampling.kv_cache static: .*needs backend: hf, not {backend}"):
        validate({**TINY, "model": model, "task": task, "backend": backend, "sampling": {"kv_cache": "static"}})


def test_auto_takes_hf_for_a_static_cache():
    cfg = validate({**TINY, "sampling": {"kv_cache": "static"}})
    assert choice.hf_only(cfg) == "sampling.kv_cache"


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_compiled_static_decode_on_cuda_matches_the_dynamic_cache(tiny_model_dir):
    """On CUDA transformers compiles the static-cache decode step (CUDA graphs): greedy
    completions of the plain model and of batched low-rank members equal the dynamic
    cache's, over two groups of other members (the second replays the first's graphs with
    its own member terms, without a recompilation)."""
    kind = Perturbation.lowrank(4)
    dynamic = HFBackend(tiny_model_dir, device="cuda", perturbation=kind, batch_size=6)
    static = HFBackend(tiny_model_dir, device="cuda", perturbation=kind, batch_size=6, kv_cache="static")
    master = dynamic.master()
    for backend in (dynamic, static):
        backend.load_master(master)
    from torch._dynamo.utils import counters

    assert static.generate_ids(PROMPTS, 16) == dynamic.generate_ids(PROMPTS, 16)
    assert hasattr(static.model, "_compiled_call")  # transformers compiled the decode step
    assert _member_rows(static, master) == _member_rows(dynamic, master)
    graphs = counters["stats"]["unique_graphs"]
    other = [13, 13, 14, 14]  # a second group: the same shapes, other members' terms
    assert _member_rows(static, master, other) == _member_rows(dynamic, master, other)
    assert counters["stats"]["unique_graphs"] == graphs  # replayed, not recompiled
