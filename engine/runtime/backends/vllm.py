"""vLLM backend: the HF backend's surface, with vLLM's batched generation.

The engine runs in this process (`VLLM_ENABLE_V1_MULTIPROCESSING=0`, one worker), so the
fp32 master is handed to the worker by reference and only `(key, sign·σ)` travel per
member; the worker extension (`vllm_worker.py`) builds `cast(master + sign·σ·E)` with the
kind's `member_tensor_` and reloads it (see there for why an in-place write would not work).
Members take the form `forms.chosen` picks from `BACKEND_FORMS["vllm"]`: own weights, or LoRA slots.

Low-rank runs (`keeps_master`): the master is loaded once per generation and every member
of a group rides on it as its own LoRA adapter (`vllm_lora`: made from the keys in the
worker, fresh adapter ids per evaluation); all members' rows, member-major, then prompt,
then sample, go to one `llm.generate`, each row with its member's `LoRARequest` and
sampling seed `(member seed, prompt, sample)`, as in the full-rank path.

Where the master lives is the kind's `master_form` (`vllm_master`: the engine's weights, or
an adapter on the frozen base that the worker keeps and serves between members).

After every weight load the prefix cache is reset: vLLM keys cached KV blocks by tokens
(and adapter name), not weights, so a block made under earlier weights would be reused.

Generation (prompts tokenized with the model's chat template, seeded sampling per prompt)
is `vllm_decode.VLLMDecoding`'s.

Import side effects to know: vLLM's CPU worker binds this process's OpenMP threads to the
cores of `VLLM_CPU_OMP_THREADS_BIND` and turns `torch.set_num_threads` into a no-op for the
rest of the process.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import torch

from seedledger.engine.config_backends import BACKEND_FORMS
from seedledger.engine.runtime.backends import vllm_scoring
from seedledger.engine.runtime.backends.base import (
    LikelihoodOutput,
    Messages,
    Population,
    PopulationOutput,
    evaluate_one_by_one,
)
from seedledger.engine.runtime.backends.vllm_decode import VLLMDecoding, request_seed
from seedledger.engine.runtime.backends.vllm_env import (
    cpu_env,
    guard_llvmlite_dunders,
    quiet_env,
    quiet_start,
    route_logs,
)
from seedledger.engine.runtime.backends.vllm_lora import Slots, engine_kwargs, slot_linears
from seedledger.engine.runtime.backends.vllm_master import MASTERS, VLLMMaster
from seedledger.ledger.errors import SeedLedgerError
from seedledger.replay.kinds import Full, PerturbationKind, member_scale
from seedledger.replay.kinds.forms import chosen

_EXTENSION = "seedledger.engine.runtime.backends.vllm_worker.SeedLedgerWorkerExtension"


class VLLMBackend(VLLMDecoding):
    """One vLLM engine (in-process) evaluated at member weights built from the fp32 master."""

    def __init__(
        self,
        model_dir: str | os.PathLike[str],
        device: str = "cpu",
        dtype: torch.dtype = torch.float32,
        temperature: float = 0.0,
        top_p: float = 1.0,
        batch_size: int | None = None,
        max_model_len: int = 2048,
        perturbation: PerturbationKind | None = None,
        members_per_forward: int = 32,
        base_quantization: str = "none",
        adapter_init: str | os.PathLike[str] | None = None,
        **llm_kwargs: Any,
    ) -> None:
        """`members_per_forward` (low-rank and LoRA runs): the LoRA slots, so the most
        members one `evaluate` takes; rows decoded together default to that many ×
        `batch_size`. An adapter kind (`master_form`, `vllm_master`): its master seeded or
        read from `adapter_init` (a PEFT directory)."""
        self.perturbation = kind = perturbation or Full()
        self.form = chosen(kind, "vllm", BACKEND_FORMS["vllm"])  # own weights, or one LoRA slot per member
        self.keeps_master = self.form.rides_master
        self.members_per_forward = members_per_forward
        if base_quantization != "none":
            raise SeedLedgerError(f"base_quantization {base_quantization}: the vllm backend serves "
                                  "the base as stored; use backend: hf")
        if os.environ.get("VLLM_ENABLE_V1_MULTIPROCESSING", "0") not in ("0", "false", "False"):
            raise NotImplementedError(
                "the vLLM backend runs its engine in-process; unset VLLM_ENABLE_V1_MULTIPROCESSING"
            )
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
        if str(device).startswith("cpu"):
            cpu_env()
        verbose = quiet_env()
        from transformers import AutoTokenizer

        self.model_dir = Path(model_dir)
        self.temperature = temperature
        self.top_p = top_p
        self._store: VLLMMaster = MASTERS[kind.master_form](self.model_dir, kind, adapter_init)
        self.frozen = self._store.frozen  # an adapter run's frozen base, as loaded
        if batch_size is not None:  # the HF backend's knob: sequences decoded together
            rows = batch_size * (members_per_forward if self.keeps_master else 1)
            llm_kwargs.setdefault("max_num_seqs", rows)
        if self.keeps_master:  # one LoRA slot per member, of the kind's rank and targets
            llm_kwargs = {**engine_kwargs(kind.lora_rank, kind.lora_targets, members_per_forward), **llm_kwargs}
        guard_llvmlite_dunders()
        with quiet_start(verbose):
            from vllm import LLM

            route_logs()
            self.llm = LLM(
                model=str(self.model_dir),
                tokenizer=str(self.model_dir),
                dtype=dtype,
                enforce_eager=True,
                max_model_len=max_model_len,
                seed=0,
                worker_extension_cls=_EXTENSION,
                disable_log_stats=True,
                use_tqdm_on_load=verbose,  # its weight-loading bars, on stderr
                **llm_kwargs,
            )
        self.tokenizer = AutoTokenizer.from_pretrained(str(self.model_dir), local_files_only=True)
        linears = slot_linears(kind, self._store.initial) if self.keeps_master else {}
        self._slots = Slots(self.llm, kind, linears)  # one per member, or the master adapter
        self._store.start(self.llm, self._slots)

    # ------------------------------------------------------------------ weights

    def master(self) -> dict[str, torch.Tensor]:
        """fp32, contiguous clones in `named_parameters()` order (the HF backend's names;
        a LoRA run: the initial adapter, named as PEFT names it)."""
        return {n: t.clone() for n, t in self._store.initial.items()}

    def load_member(self, master: dict[str, torch.Tensor], key: int, sign: int, sigma: float) -> None:
        """Set the engine's weights to `cast(master + sign*sigma*eps(key))` (built on the worker)."""
        if self.keeps_master:
            raise ValueError(f"{self.perturbation.label} members are served in LoRA slots: use evaluate()")
        scale = member_scale(sign, sigma)
        self.llm.collective_rpc("seedledger_load", args=(self.perturbation, key, scale, master))
        self.llm.reset_prefix_cache()

    def load_master(self, master: dict[str, torch.Tensor]) -> None:
        """Write the master into the engine (its weights: this drops every LoRA adapter; an
        adapter run's adapter: to the worker, which serves it between members)."""
        self._store.load(master)

    def close(self) -> None:
        """Drop the engine and vLLM's process group, so another backend can start here."""
        import gc

        from vllm.distributed.parallel_state import cleanup_dist_env_and_memory

        self.llm.llm_engine.engine_core.shutdown()
        del self.llm
        cleanup_dist_env_and_memory()
        gc.collect()

    def probe(self, name: str) -> list[float]:
        """First values of the engine's parameter `name` (vLLM's naming), for tests."""
        return self.llm.collective_rpc("seedledger_probe", args=(name,))[0]

    def evaluate(
        self,
        master: dict[str, torch.Tensor],
        population: Population,
        prompts: list[Messages],
        max_new_tokens: int,
        samples: int = 1,
    ) -> PopulationOutput:
        """Every member's completions (see `engine.runtime.backends.base`). Full-rank: one weight
        reload and one `generate` per member. Low-rank and LoRA runs: the engine must hold
        the master (`load_master` after each update); one adapter per member, one `generate`."""
        if population.paths or population.shrink != 1.0:  # the config refuses such runs; the API may not
            raise ValueError("members along the replay state's paths (LM-MA-ES, GA survivors) need the hf backend")
        if not self.keeps_master:
            return evaluate_one_by_one(self, master, population, prompts, max_new_tokens, samples)
        if len(population) > self.members_per_forward:
            raise ValueError(
                f"{len(population)} members exceed the engine's {self.members_per_forward} LoRA slots"
            )
        started = time.perf_counter()
        adapters = self._slots.members(population)
        loaded = time.perf_counter()
        entries = [(m, i, s) for m in range(len(population))
                   for i in range(len(prompts)) for s in range(samples)]
        streams = [request_seed(population.seeds[m], i, s) for m, i, s in entries]
        texts = self._generate_rows(
            [i for _, i, _ in entries], prompts, streams, max_new_tokens,
            adapters=[adapters[m] for m, _, _ in entries],
        )
        per = len(prompts) * samples
        return PopulationOutput(
            [texts[m * per : (m + 1) * per] for m in range(len(population))],
            {"load_member": loaded - started, "generate": time.perf_counter() - loaded},
        )

    def loglik(
        self, master: dict[str, torch.Tensor], population: Population, prompts: list[Messages],
        references: list[str],
    ) -> LikelihoodOutput:
        """Likelihood fitness from vLLM's prompt log-probabilities (`vllm_scoring`)."""
        return vllm_scoring.loglik(self, master, population, prompts, references)

    def _master_adapter(self) -> Any:
        """The LoRA request plain generation carries (an adapter run's master; else None)."""
        return self._store.served()
