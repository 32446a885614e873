"""Chat generation on an in-process vLLM engine: what `VLLMBackend` decodes with.

Prompts are tokenized here with the model's own chat template, exactly as the HF backend
does, and completions are decoded here from token ids, so both backends see and return the
same text for the same tokens. Greedy decoding is the default; seeded sampling gives each
prompt its own vLLM seed derived from `(seed, prompt index)`, so a prompt's stream does not
depend on its batch (the stream differs from the HF backend's: seeded sampling is
reproducible per backend, not across backends).
"""

from __future__ import annotations

from typing import Any

from seedledger.engine.runtime.backends.base import Messages
from seedledger.engine.runtime.backends.seeded_sampling import prompt_stream_seed


class VLLMDecoding:
    """Generation for a backend holding `llm`, `tokenizer` and its default `temperature` /
    `top_p`; `_master_adapter()` is the LoRA request plain generation serves (None: none)."""

    llm: Any
    tokenizer: Any
    temperature: float
    top_p: float

    def _master_adapter(self) -> Any:
        return None


    def _token_prompts(self, prompts: list[Messages]) -> list[dict[str, list[int]]]:
        out = []
        for messages in prompts:
            text = self.tokenizer.apply_chat_template(
                messages, tokenize=False, add_generation_prompt=True
            )
            ids = self.tokenizer(text, add_special_tokens=False)["input_ids"]
            out.append({"prompt_token_ids": list(ids)})
        return out

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
        """Completions for chat prompts, in order; greedy unless temperature > 0 (needs seed).

        `samples` > 1: that many completions per prompt, prompt-major, one request each;
        sample s of prompt i is seeded by `(seed, i, s)`, and sample 0 by `(seed, i)` as
        with one sample, so `samples=1` is plain seeded sampling."""
        if samples < 1:
            raise ValueError(f"samples must be >= 1, not {samples}")
        entries = [(i, s) for i in range(len(prompts)) for s in range(samples)]
        streams = [request_seed(seed, i, s) for i, s in entries]
        served = self._master_adapter()
        return self._generate_rows(
            [i for i, _ in entries], prompts, streams, max_new_tokens,
            temperature=temperature, top_p=top_p,
            adapters=None if served is None else [served] * len(entries),
        )

    def _generate_rows(
        self,
        rows: list[int],
        prompts: list[Messages],
        streams: list[int | None],
        max_new_tokens: int,
        *,
        temperature: float | None = None,
        top_p: float | None = None,
        adapters: list[Any] | None = None,
    ) -> list[str]:
        """One `llm.generate` over the rows (indices into `prompts`), each with its own
        stream seed (None: greedy is required) and LoRA request (None: the master)."""
        from vllm import SamplingParams

        temperature = self.temperature if temperature is None else temperature
        top_p = self.top_p if top_p is None else top_p
        if temperature > 0.0 and any(s is None for s in streams):
            raise ValueError("sampling (temperature > 0) needs a seed to stay deterministic")
        params = [
            SamplingParams(
                max_tokens=max_new_tokens,
                temperature=temperature,
                top_p=top_p if temperature > 0.0 else 1.0,
                seed=stream,
                detokenize=False,
            )
            for stream in streams
        ]
        tokens = self._token_prompts(prompts)
        outputs = self.llm.generate(
            [tokens[i] for i in rows], params, use_tqdm=False, lora_request=adapters
        )
        return [
            self.tokenizer.decode(o.outputs[0].token_ids, skip_special_tokens=True)
            for o in outputs
        ]


def request_seed(seed: int | None, index: int, sample: int) -> int | None:
    """vLLM's per-request seed for sample `sample` of prompt `index` (None: greedy)."""
    return None if seed is None else prompt_stream_seed(seed, index, sample)
