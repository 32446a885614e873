"""Chat generation on a transformers model: what `HFBackend` decodes with.

Decoding guarantee. Greedy (the default, `seed=None` or `temperature=0`) and seeded
sampling are deterministic for the same prompts, batch size, device and dtype. In seeded
sampling the uniform draws for prompt i come from a CPU generator seeded by `(seed, i)`
alone (i = index in `prompts`), one draw per new token, and the token is picked by inverse
CDF (over the probability-sorted, top-p-truncated distribution when top_p < 1, else in
vocabulary order); the stream never depends on the batch's other prompts. The logits may
still differ in the last bits when padding changes (another batch composition), which can,
rarely, flip a near-tie; bit-exact outputs across batch compositions are not promised.

KV cache. `kv_cache="static"` decodes into transformers' preallocated cache (its
`cache_implementation="static"`); on CUDA transformers then compiles the decode step
(`torch.compile`, mode reduce-overhead: CUDA graphs), which is what the option is for: a
small model's decode step is bound by kernel launches there. The member terms' forward
hooks (`hf_lowrank`) are traced into the graph; a new group's terms are new inputs of the
same shapes, not a recompilation (CUDA graphs copy such inputs into their own buffers
before each step, in one `_foreach_copy_`). The static cache attends over its whole
(masked) length, so its logits equal the dynamic cache's only up to summation order
(1.3e-6 on `tiny`, the CPU): greedy completions match but at near-ties, and a seeded sample
can differ where near-equal probabilities reorder, as with another batch composition. A run
is deterministic with either cache; the cache is part of its stored config.

`samples=n` (pass@k): n completions per prompt, prompt-major; sample s of prompt i draws
from the stream seeded by `(seed, i, s)`, sample 0 by `(seed, i)` as with `samples=1`.
"""

from __future__ import annotations

from typing import Any

import torch

from seedledger.engine.runtime.backends.base import Messages
from seedledger.engine.runtime.backends.seeded_sampling import SeededSampler, prompt_stream_seed

# A static cache's length is rounded up to a multiple of this: each new length is a new
# compiled shape on CUDA, and transformers keeps the longest so far (`max_cache_len`).
CACHE_BUCKET = 256


class HFDecoding:
    """Generation for a backend holding `model`, `tokenizer` (left-padded), `device`,
    `batch_size`, its default `temperature` / `top_p` and its `kv_cache` (dynamic or static)."""

    model: Any
    tokenizer: Any
    device: torch.device
    batch_size: int
    temperature: float
    top_p: float
    kv_cache: str

    def _encode(self, prompts: list[Messages]) -> dict[str, torch.Tensor]:
        texts = [
            self.tokenizer.apply_chat_template(p, tokenize=False, add_generation_prompt=True)
            for p in prompts
        ]
        enc = self.tokenizer(texts, return_tensors="pt", padding=True, add_special_tokens=False)
        return {k: v.to(self.device) for k, v in enc.items()}

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
        """Completions for chat prompts, in order; batched by `batch_size`, left-padded.
        Greedy unless the temperature (argument, else the constructor's) is > 0, which needs
        a `seed` (the module docstring); `samples` > 1 gives that many per prompt, prompt-major."""
        ids = self.generate_ids(
            prompts, max_new_tokens, seed, temperature=temperature, top_p=top_p, samples=samples
        )
        return self.tokenizer.batch_decode(ids, skip_special_tokens=True)

    def generate_ids(
        self,
        prompts: list[Messages],
        max_new_tokens: int,
        seed: int | None = None,
        *,
        temperature: float | None = None,
        top_p: float | None = None,
        samples: int = 1,
    ) -> list[list[int]]:
        """The new token ids per prompt (per sample, prompt-major, with `samples` > 1), up to
        and including EOS (no padding after it)."""
        temperature = self.temperature if temperature is None else temperature
        if temperature > 0.0 and seed is None:
            raise ValueError("sampling (temperature > 0) needs a seed to stay deterministic")
        if samples < 1:
            raise ValueError(f"samples must be >= 1, not {samples}")
        # (prompt index, sample index), prompt-major; with samples=1 simply the prompts
        entries = [(i, s) for i in range(len(prompts)) for s in range(samples)]
        streams = [None if seed is None else prompt_stream_seed(seed, i, s) for i, s in entries]
        return self._decode(
            [prompts[i] for i, _ in entries], streams, max_new_tokens, batch=self.batch_size,
            temperature=temperature, top_p=top_p,
        )

    @torch.inference_mode()
    def _decode(
        self,
        rows: list[Messages],
        streams: list[int | None],
        max_new_tokens: int,
        *,
        batch: int,
        temperature: float | None = None,
        top_p: float | None = None,
    ) -> list[list[int]]:
        """New token ids of every row, `batch` rows per `generate` call. A sampled row
        draws its uniforms from a CPU generator seeded by its own stream seed."""
        from transformers import GenerationConfig, LogitsProcessorList

        temperature = self.temperature if temperature is None else temperature
        top_p = self.top_p if top_p is None else top_p
        sampling = temperature > 0.0
        if sampling and any(s is None for s in streams):
            raise ValueError("sampling (temperature > 0) needs a seed to stay deterministic")
        tok = self.tokenizer
        gen_cfg = GenerationConfig(
            max_new_tokens=max_new_tokens,
            do_sample=False,
            eos_token_id=self.model.generation_config.eos_token_id or tok.eos_token_id,
            pad_token_id=tok.pad_token_id,
            bos_token_id=self.model.generation_config.bos_token_id,
        )
        eos = gen_cfg.eos_token_id
        stops = set(eos if isinstance(eos, list) else [eos])
        outputs: list[list[int]] = []
        for start in range(0, len(rows), batch):
            enc = self._encode(rows[start : start + batch])
            prompt_len = enc["input_ids"].shape[1]
            if self.kv_cache == "static":  # one cache length per bucket, not per prompt length: fewer recompiles
                gen_cfg.cache_implementation = "static"
                gen_cfg.max_cache_len = -(-(prompt_len + max_new_tokens) // CACHE_BUCKET) * CACHE_BUCKET
            procs = None
            if sampling:
                uniforms = torch.stack(
                    [
                        torch.rand(
                            max_new_tokens,
                            generator=torch.Generator("cpu").manual_seed(stream),
                            dtype=torch.float64,
                        )
                        for stream in streams[start : start + batch]
                    ]
                )
                procs = LogitsProcessorList(
                    [SeededSampler(uniforms, prompt_len, temperature, top_p)]
                )
            out = self.model.generate(**enc, generation_config=gen_cfg, logits_processor=procs)
            for row in out[:, prompt_len:].tolist():
                cut = next((i + 1 for i, t in enumerate(row) if t in stops), len(row))
                outputs.append(row[:cut])
        return outputs
