"""Teacher-forced token scoring on a transformers model: log p of given completion tokens.

Two users: the KL-to-base penalty (a member's own decoded tokens, under the member and
under the frozen base) and the `loglik` fitness (each row's reference answer under every
member of a group, `trainers.rewards.loglik`). A row is its chat prompt (with the
generation prompt, as decoding sees it) followed by the completion's tokens; rows are
left-padded so the completion tokens end every row, and only the last `keep` positions'
logits are computed (`logits_to_keep`).

Chunks. The KL path scores `SCORE_ROWS` rows per forward (its stored figures depend on
it). Likelihood fitness packs as many rows as fit `LOGITS_BUDGET` fp32 logits per forward:
a member's reference answers are short, so one forward serves most of a group. Chunks
depend only on the rows (never on free memory), so a member's scores are the same in
every process that evaluates it.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from typing import Any

import torch

from seedledger.engine.runtime.backends.base import LikelihoodOutput, Messages, Population
from seedledger.trainers.rewards.loglik import mean_logprob

SCORE_ROWS = 8  # KL: rows per teacher-forced forward (its logits: rows × tokens × vocab)
LOGITS_BUDGET = 1 << 25  # loglik: fp32 logits per forward (128 MiB)
MAX_ROWS = 64  # loglik: rows per forward at most (activations grow with rows × prompt)

RowsContext = Callable[[Sequence[int]], AbstractContextManager[None]]


def prompt_ids(tokenizer, prompts: Sequence[Messages]) -> list[list[int]]:
    """Each chat prompt's token ids, generation prompt included (what decoding continues)."""
    texts = [tokenizer.apply_chat_template(p, tokenize=False, add_generation_prompt=True) for p in prompts]
    return [list(ids) for ids in tokenizer(texts, add_special_tokens=False)["input_ids"]]


def reference_ids(tokenizer, end_of_turn: int, references: Sequence[str]) -> list[list[int]]:
    """Each reference completion's token ids, ended by the end-of-turn token as a member's
    own answer would be (it is rewarded for stopping too)."""
    return [list(ids) + [end_of_turn] for ids in tokenizer(list(references), add_special_tokens=False)["input_ids"]]


def budget_chunks(prompts: Sequence[Sequence[int]], completions: Sequence[Sequence[int]], vocab: int) -> list[range]:
    """Consecutive row ranges whose kept logits (rows × (longest completion + 1) × vocab)
    stay within `LOGITS_BUDGET`, at most `MAX_ROWS` rows each."""
    chunks, start = [], 0
    while start < len(completions):
        end, keep = start, 1
        while end < len(completions) and end - start < MAX_ROWS:
            wider = max(keep, len(completions[end]) + 1)
            if end > start and (end + 1 - start) * wider * vocab > LOGITS_BUDGET:
                break
            keep, end = wider, end + 1
        chunks.append(range(start, end))
        start = end
    return chunks


def fixed_chunks(count: int, size: int = SCORE_ROWS) -> list[range]:
    return [range(s, min(s + size, count)) for s in range(0, count, size)]


@torch.inference_mode()
def token_logprobs(
    model, pad: int, device: torch.device, prompts: Sequence[Sequence[int]],
    completions: Sequence[Sequence[int]], chunks: Sequence[range],
    member_rows: RowsContext | None = None, member_of_row: Sequence[int] | None = None,
) -> list[list[float]]:
    """log p(token) of every completion token given its prompt and the tokens before it
    (temperature 1), one forward per chunk. `member_rows(owners)`: a context in which row
    i of the forward belongs to member `owners[i]` (low-rank and adapter groups)."""
    out: list[list[float]] = []
    for part in chunks:
        full = [list(prompts[i]) + list(completions[i]) for i in part]
        width = max(len(f) for f in full)
        keep = max(len(completions[i]) for i in part) + 1
        ids = torch.tensor([[pad] * (width - len(f)) + f for f in full], device=device)
        mask = torch.tensor([[0] * (width - len(f)) + [1] * len(f) for f in full], device=device)
        positions = (mask.cumsum(-1) - 1).clamp(min=0)
        context = (
            member_rows([member_of_row[i] for i in part])
            if member_rows is not None and member_of_row is not None else contextlib.nullcontext()
        )
        with context:
            output = model(input_ids=ids, attention_mask=mask, position_ids=positions, logits_to_keep=keep)
            logits = output.logits.float()
        logp = torch.log_softmax(logits[:, :-1], dim=-1)  # predicts the last keep-1 tokens
        for j, i in enumerate(part):
            n = len(completions[i])
            if n == 0:
                out.append([])
                continue
            tokens = torch.tensor(list(completions[i]), device=device)
            out.append(logp[j, keep - 1 - n :].gather(1, tokens.view(-1, 1)).view(-1).tolist())
    return out


def end_of_turn(eos: int | list[int] | None, tokenizer: Any) -> int:
    """The token a member's answer ends with: the model's (first) EOS from its generation
    config, else the tokenizer's. Both backends score references with it."""
    eos = eos or tokenizer.eos_token_id
    return int(eos[0] if isinstance(eos, list) else eos)


def loglik(
    backend: Any, master: dict[str, torch.Tensor], population: Population, prompts: Sequence[Messages],
    references: Sequence[str],
) -> LikelihoodOutput:
    """Every member's mean log-probability of each row's reference completion on an
    `HFBackend`, by teacher forcing: low-rank and adapter groups score all members' rows
    together (`members`), full-rank members load their weights in turn."""
    started = time.perf_counter()
    tok = backend.tokenizer
    contexts = prompt_ids(tok, prompts)
    targets = reference_ids(tok, end_of_turn(backend.model.generation_config.eos_token_id, tok), references)
    vocab, pad, members = backend.model.config.vocab_size, tok.pad_token_id, len(population)
    loading = 0.0
    if backend._rows is None:
        chunks = budget_chunks(contexts, targets, vocab)
        lps: list[list[float]] = []
        weights = backend.perturbation.member_weights(master)  # once, not per member (quant_codes dequantizes)
        for key, sign, row in zip(population.keys, population.signs, population.paths or [()] * members,
                                  strict=True):
            began = time.perf_counter()
            backend.load_member(master, key, sign, population.sigma, paths=row, state=population.state,
                                weights=weights)
            loading += time.perf_counter() - began
            lps += token_logprobs(backend.model, pad, backend.device, contexts, targets, chunks)
    else:
        owner = [m for m in range(members) for _ in prompts]
        with backend.members(master, population.keys, population.signs, population.sigma,
                             shrink=population.shrink, paths=population.paths, state=population.state):
            lps = token_logprobs(backend.model, pad, backend.device, contexts * members, targets * members,
                                 budget_chunks(contexts * members, targets * members, vocab),
                                 backend._rows.rows, owner)
    scores = [mean_logprob(lp) for lp in lps]
    per = len(prompts)
    return LikelihoodOutput([scores[m * per : (m + 1) * per] for m in range(members)],
                            {"load_member": loading, "score": time.perf_counter() - started - loading})
