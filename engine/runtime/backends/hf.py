"""Transformers backend: member weights rebuilt from the fp32 master, batched chat generation.

Member weights are `cast(master + sign*sigma*E)`, written in place by the kind's own
`member_tensor_`, so evaluation sees the weights replay builds; nothing is ever undone
by subtraction (that drifts in low precision).

Generation (greedy or seeded sampling, pass@k samples) is `hf_decode.HFDecoding`'s, and
its decoding guarantee is stated there.
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

import torch

from seedledger.engine.config_backends import BACKEND_FORMS
from seedledger.engine.runtime.backends import hf_scoring
from seedledger.engine.runtime.backends.base import (
    LikelihoodOutput,
    Messages,
    Population,
    PopulationOutput,
)
from seedledger.engine.runtime.backends.hf_decode import HFDecoding
from seedledger.engine.runtime.backends.hf_master import MASTERS, HFMaster
from seedledger.engine.runtime.backends.seeded_sampling import prompt_stream_seed
from seedledger.engine.runtime.models.resolve import load_causal_lm
from seedledger.replay.kinds import Full, PerturbationKind, member_scale
from seedledger.replay.kinds.forms import OWN_WEIGHTS, MemberForm, chosen


class HFBackend(HFDecoding):
    """One transformers causal LM on `device` in `dtype`, evaluated at member weights.

    Full-rank runs load each member's weights in turn; low-rank runs keep the master in
    the model, adapter runs a frozen base, and both decode a whole group of members in
    one batched forward (`hf_lowrank.RowTerms`)."""

    def __init__(
        self,
        model_dir: str | os.PathLike[str],
        device: str | torch.device = "cpu",
        dtype: torch.dtype = torch.float32,
        batch_size: int = 16,
        temperature: float = 0.0,
        top_p: float = 1.0,
        perturbation: PerturbationKind | None = None,
        base_quantization: str = "none",
        adapter_init: str | os.PathLike[str] | None = None,
        kl_reference: bool = False,
        kv_cache: str = "dynamic",
    ) -> None:
        """Where the master lives is the kind's `master_form` (`hf_master`): the model's
        weights, or an adapter on a frozen base (`base_quantization`), seeded or read from
        `adapter_init` (a PEFT directory)."""
        from transformers import AutoTokenizer

        self.model_dir = Path(model_dir)
        self.device = torch.device(device)
        self.dtype = dtype
        self.batch_size = batch_size
        self.temperature = temperature
        self.top_p = top_p
        if kv_cache not in ("dynamic", "static"):
            raise ValueError(f"kv_cache must be dynamic or static, not {kv_cache!r}")
        self.kv_cache = kv_cache
        self.perturbation = kind = perturbation or Full()
        self.form = chosen(kind, "hf", BACKEND_FORMS["hf"])  # how members are built
        model = load_causal_lm(self.model_dir, device=self.device, dtype=torch.float32,
                               quantization=base_quantization)
        model.requires_grad_(False)  # the master comes from the fp32 checkpoint, whatever the model's dtype
        self._store: HFMaster = MASTERS[kind.master_form](model, kind, quantization=base_quantization,
                                                          adapter_init=adapter_init, keep_fp32=dtype != torch.float32)
        self.frozen = self._store.frozen  # an adapter run's frozen base, as loaded
        if dtype != torch.float32:
            model.to(dtype)
        self.model = model
        tok = AutoTokenizer.from_pretrained(str(self.model_dir), local_files_only=True)
        tok.padding_side = "left"
        if tok.pad_token is None:
            tok.pad_token = tok.eos_token
        self.tokenizer = tok
        self.keeps_master = self.form.rides_master
        self._rows = None
        if self.keeps_master:  # members ride on the master as per-row terms (scales) the kind builds
            from seedledger.engine.runtime.backends.hf_lowrank import RowTerms
            from seedledger.engine.runtime.backends.hf_quant import ScaleRows

            self._rows = {MemberForm.ROW_TERMS: RowTerms, MemberForm.ROW_SCALES: ScaleRows}[self.form].of(model, kind)
        self._store.attach(self._rows)
        self._reference = None  # the frozen base model, for the KL-to-base penalty
        if kl_reference:
            self._reference = load_causal_lm(self.model_dir, device=self.device, dtype=torch.float32)
            self._reference.requires_grad_(False)
            self._reference.to(dtype)

    # ------------------------------------------------------------------ weights

    def master(self) -> dict[str, torch.Tensor]:
        """fp32, contiguous clones on the model's device, in `named_parameters()` order
        (an adapter run: the initial adapter, in the targeted linears' order)."""
        return {n: t.detach().to(torch.float32).clone().contiguous() for n, t in self._store.initial().items()}

    @property
    def _params(self) -> dict[str, torch.Tensor]:
        """What `load_member` writes: every weight (tied ones once), none on a frozen base."""
        return self._store.params

    @torch.no_grad()
    def load_member(self, master: dict[str, torch.Tensor], key: int, sign: int, sigma: float, *,
                    paths: Sequence[float] = (), state: Any = None, weights: dict | None = None) -> None:
        """Set the model to the member's weights, the kind's `member_tensor_` tensor by tensor
        (`cast(w + sign*sigma*E(key))` on its trained tensors, w: `weights`, its `member_weights`
        built once per population; with `paths` (GA survivors) `+ Σⱼ pathsⱼ·Mⱼ` in fp32)."""
        if not self.perturbation.forms & OWN_WEIGHTS:
            raise ValueError(f"{self.perturbation.label} members have no weights of their own: use evaluate()")
        kind, scale = self.perturbation, member_scale(sign, sigma)
        weights = weights or kind.member_weights(master)
        for name, param in self._params.items():
            kind.member_tensor_(param.data, name, weights, key, scale, paths, state)

    def load_master(self, master: dict[str, torch.Tensor]) -> None:
        """Write the master into the model (a cast for low-precision models); an adapter
        becomes the term every row gets while no member is in flight (int8 scales: `hf_quant`)."""
        self._store.load(master)

    # ------------------------------------------------------------------ evaluation

    def evaluate(
        self,
        master: dict[str, torch.Tensor],
        population: Population,
        prompts: list[Messages],
        max_new_tokens: int,
        samples: int = 1,
    ) -> PopulationOutput:
        """Every member's completions (see `engine.runtime.backends.base`). Full-rank: each
        member's weights in turn. Low-rank and adapters: the model holds the master
        (`load_master` after each update) and all members' rows (member-major, then
        prompt, then sample) decode in one `generate`. With `kl_reference`, every
        completion's token log-probabilities under the member and under the frozen base
        come back too."""
        per = len(prompts) * samples
        rows = [p for p in prompts for _ in range(samples)]  # one member's rows
        seconds = {"load_member": 0.0, "generate": 0.0}
        ids: list[list[int]] = []
        member_lps: list[list[float]] = []
        if self._rows is None:
            if population.shrink != 1.0:
                raise ValueError("LM-MA-ES members (shrink α) need an adapter run")
            path_rows = population.paths or [()] * len(population)
            weights = self.perturbation.member_weights(master)  # once, not per member (quant_codes dequantizes)
            for key, sign, seed, row in zip(population.keys, population.signs, population.seeds, path_rows,
                                            strict=True):
                started = time.perf_counter()
                self.load_member(master, key, sign, population.sigma, paths=row, state=population.state,
                                 weights=weights)
                loaded = time.perf_counter()
                mine = self.generate_ids(prompts, max_new_tokens, seed, samples=samples)
                if self._reference is not None:
                    member_lps += self._token_logprobs(self.model, rows, mine)
                ids += mine
                seconds["load_member"] += loaded - started
                seconds["generate"] += time.perf_counter() - loaded
        else:
            started = time.perf_counter()
            streams = [
                None if seed is None else prompt_stream_seed(seed, i, s)
                for seed in population.seeds
                for i in range(len(prompts))
                for s in range(samples)
            ]
            with self.members(master, population.keys, population.signs, population.sigma,
                              shrink=population.shrink, paths=population.paths, state=population.state):
                loaded = time.perf_counter()
                ids = self._decode(rows * len(population), streams, max_new_tokens, batch=per * len(population))
                if self._reference is not None:
                    owner = [m for m in range(len(population)) for _ in range(per)]
                    member_lps = self._token_logprobs(self.model, rows * len(population), ids, owner)
            seconds = {"load_member": loaded - started, "generate": time.perf_counter() - loaded}
        texts = self.tokenizer.batch_decode(ids, skip_special_tokens=True)
        logprobs = None
        if self._reference is not None:
            base_lps = self._token_logprobs(self._reference, rows * len(population), ids)
            pairs = list(zip(member_lps, base_lps, strict=True))
            logprobs = [pairs[m * per : (m + 1) * per] for m in range(len(population))]
        return PopulationOutput(
            [texts[m * per : (m + 1) * per] for m in range(len(population))], seconds, logprobs
        )

    def members(self, master: dict[str, torch.Tensor], keys: Sequence[int], signs: Sequence[int],
                sigma: float, *, shrink: float = 1.0, paths: Sequence[Sequence[float]] = (),
                state: Any = None) -> AbstractContextManager[None]:
        """Within the block, rows belong to these members (member-major, equal shares):
        each row gets its member's low-rank term or perturbed adapter (an LM-MA-ES member's
        with its `paths` terms along `state`, `Population`)."""
        if self._rows is None:
            raise ValueError("full-rank members have weights of their own: use load_member")
        scales = [member_scale(s, sigma, shrink) for s in signs]
        return self._rows.active(self._rows.terms(self.perturbation, master, keys, scales, paths=paths, state=state))

    def _token_logprobs(
        self, model, rows: list[Messages], completions: list[list[int]],
        member_of_row: list[int] | None = None,
    ) -> list[list[float]]:
        """Each completion token's log-probability given its prompt (`hf_scoring`, KL's fixed
        chunks). `member_of_row`: inside a `members` block, which member each row belongs to."""
        return hf_scoring.token_logprobs(
            model, self.tokenizer.pad_token_id, self.device, hf_scoring.prompt_ids(self.tokenizer, rows),
            completions, hf_scoring.fixed_chunks(len(rows)),
            self._rows.rows if member_of_row is not None else None, member_of_row,
        )

    def loglik(
        self, master: dict[str, torch.Tensor], population: Population, prompts: list[Messages],
        references: list[str],
    ) -> LikelihoodOutput:
        """Likelihood fitness by teacher forcing (`hf_scoring.loglik`)."""
        return hf_scoring.loglik(self, master, population, prompts, references)
